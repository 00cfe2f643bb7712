"""The governed memory service (``serve``, ADR 0001): the store in a process of its own, reached by agent runtimes
through its data plane, ``governed_memory.v1.DataPlane`` (``data_plane.proto``).

    data_plane.proto   the wire, declared once; ``data_plane_pb2*.py`` are generated from it and committed
    wire               what both ends agree on beyond the .proto: metadata, bounds, the status of each reason code
    server             the servicer over a real ``Store``: verifies the caller's identity and scope token on each call
    remote             ``RemoteStore``, the runtime's client; imports nothing of the server or the store
    values             what ``RemoteStore`` answers, field for field the store's

The generated modules come from grpcio-tools 1.76.0 (protobuf gencode 6.31.1, which the protobuf 6.33.5 of both
locks accepts; its gRPC code needs grpcio >= 1.76.0, the older lock's), in a throw-away virtualenv, never a
dependency of this package::

    uv venv /tmp/protoc-venv && uv pip install --python /tmp/protoc-venv/bin/python grpcio-tools==1.76.0
    /tmp/protoc-venv/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \\
        kagent_memory_governed/service/data_plane.proto
"""
