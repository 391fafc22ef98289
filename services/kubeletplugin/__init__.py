"""The kubelet-facing gRPC front: kubelet sockets in, NATS requests to the node's preparer out.

It owns nothing but the sockets, the kubelet's registration and the node's
presence record; every prepare and unprepare is done by the preparer.
"""
