"""Frontends: endpoints that wrap a server and serve its models to other processes. Each
owns its options (e.g. :class:`~embedtriton.frontends.grpc.GrpcOptions`); the server knows
none of them, only that it drains and stops what is attached to it."""
