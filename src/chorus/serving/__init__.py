"""Serving many voices on one resident base: voice store (metadata and adapter blobs), engine, batcher, routes."""
