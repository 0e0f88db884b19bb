"""`trainfeed decoder`: a stateless decode worker serving trainers over Arrow Flight (issue 37).

`work` turns one request into decoded chunks: it reads the partition from storage with the
reader's own partition reader and delivery order (trainfeed.reader.batcher.partition_loader) and
decodes with the pipeline's own decoder (trainfeed.reader.pipeline.image_decoder), so that a
remote-decoded record is byte for byte the local one. `service` is the Flight shell around it:
the token check, the request bounds, the trainer's credit. The trainer's side is
trainfeed.decode.remote; nothing on the read side imports this package.
"""
