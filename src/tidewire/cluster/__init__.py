"""Cluster mode: hubs as stateless gateways over a NATS JetStream cluster (docs/cluster.md).

``local`` runs a local cluster (``tidewire cluster local``); the JetStream storage backend
lives beside it. Importing this package loads neither nats-py nor a server.
"""
