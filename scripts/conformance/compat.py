"""Shim (the ONLY behavioural stub): transformers 5.25's DynamicCache.crop refuses a positive argument, which in 4.x
(the version the official code was written for, z-lab config says 4.57.3) meant "keep the first n positions".
The official code calls past_key_values.crop(start) with that meaning; this restores it."""
from transformers import DynamicCache


class CompatDynamicCache(DynamicCache):
    def crop(self, max_length: int):
        if max_length >= 0:
            max_length = max_length - self.get_seq_length()
            if max_length >= 0:
                return
        return super().crop(max_length)
