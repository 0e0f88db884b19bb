"""Remote decode, the trainer's side: a partition read and decoded by a decode worker.

A trainer whose cores cannot keep up with decoding (issue 37) sends "read partition p of epoch e
from record k and decode it as these options say" to a stateless decoder (`trainfeed decoder`,
trainfeed.decoder) and receives uint8 pixels. Leasing, positions, the batcher and the shuffle
stay on the trainer. `wire` is the request and reply shape both sides share; `client` spreads
requests over decoders and resumes a segment elsewhere when a decoder dies.
"""
