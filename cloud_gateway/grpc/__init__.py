"""grpc front end."""
