"""On-disk formats: the `.list` input files, Parquet shards and the dataset manifest."""
