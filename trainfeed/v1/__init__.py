"""Generated gRPC code of the `trainfeed.v1` wire API (proto/trainfeed/v1/*.proto).

Do not edit: run `python proto/generate.py`. Lives at `trainfeed/v1` so that the import paths protoc
writes (`from trainfeed.v1 import master_pb2`) resolve without rewriting.
"""
