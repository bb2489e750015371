"""Schemas of what onceflow stores: ``txn_log.proto`` (the commit log of a transaction group) and its
generated module ``txn_log_pb2``."""
