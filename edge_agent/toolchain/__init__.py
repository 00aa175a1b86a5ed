"""The model toolchain: what a model costs, and the package a device runs.

For model authors and operators, never for the daemon: it imports ``onnx``
and ``onnxruntime.quantization`` (the ``build`` extra), so nothing on the
agent's serving path imports this package. One module per job:

- :mod:`.figures`: the figures of one model (FLOPs and MACs per op type,
  parameters, weight bytes, activation peak, memory traffic), the table and
  the JSON of ``edge-agent models inspect``;
- :mod:`.onnx_graph` and :mod:`.tflite_graph`: those figures read from an
  ONNX graph (shapes inferred at a batch size, symbolically where needed) and
  from a TFLite flatbuffer (through the LiteRT interpreter);
- :mod:`.data`: calibration and evaluation data (images preprocessed as the
  manifest says, or arrays), and ``.npz`` files written byte for byte the same;
- :mod:`.convert`: the variants (FP32 with offline graph optimization, FP16
  with overflow checks, INT8 static QDQ and dynamic);
- :mod:`.verify`: every variant against FP32, and the tolerance it must meet;
- :mod:`.measure`: latency at batch 1 and throughput at the best batch,
  variants side by side;
- :mod:`.build`: ``edge-agent models build``, from a source to a package.
"""
