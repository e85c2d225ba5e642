"""Sharded batch inference that proves every input row comes back once, in order.

Planning (`plan`) and gathering (`gather`) never import torch, so they run anywhere in seconds;
inference (`infer`) runs one contiguous shard on one device.
"""
