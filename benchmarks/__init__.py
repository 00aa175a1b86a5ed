"""The project's comparative and paper benchmarks, outside the product (not in the
wheel): ``python -m benchmarks NAME [options]``, ``--help`` lists them.

- :mod:`benchmarks.agent`: the device's, each starting what it measures (a gateway,
  a broker, the daemon) on loopback: ``hybrid``, ``offload``, ``ota``, ``mqtt``,
  ``service``, ``privacy``, ``stream``;
- :mod:`benchmarks.gateway`: the gateway's against its limits (``gateway``), behind a
  remote engine (``remote``), with a simulated fleet (``fleet``) and its dashboard
  (``dashboard``);
- :mod:`benchmarks.peers`: the gateway beside Triton and MLServer (``peers``);
- :mod:`benchmarks.page`: the figures page, ``docs/benchmarks/figures.md``, from the
  JSON the others write (``figures``, ``stamp``), against :mod:`benchmarks.targets`.

What an operator runs against their own deployment stays in the product, as one
command each: ``edge-agent bench --model M`` (a model's latency on this device) and
``cloud-gateway bench`` (load against a running gateway). The product never imports
this package (an import contract of ``pyproject.toml``); these import the product.
"""
