"""The master's pure core: what it decides, apart from how it hears and answers.

Every module here takes the current time as an argument and returns what changed; none imports
grpc, asyncio, an HTTP server, the journal writer or a state store (the `forbidden` contract in
pyproject.toml's [tool.importlinter], checked by tests/test_layers.py), nor the wire's
generated classes (`trainfeed.v1`): it speaks its own types (trainfeed.master.core.messages),
and the shells that wrap it, beside it in trainfeed.master.serve, convert each message once
(trainfeed.master.serve.convert).
"""
