"""The master's pure core: what it decides, apart from how it hears and answers.

Every module here takes the current time as an argument and returns what changed; none imports
grpc, asyncio, an HTTP server, the journal writer or a state store (the `forbidden` contract in
pyproject.toml's [tool.importlinter], checked by tests/test_layers.py). Messages of the wire
(`trainfeed.v1.master_pb2`, generated data classes) may still cross it. The shells that wrap it
sit beside it in trainfeed.master.serve.
"""
