"""rest front end."""
