"""What users touch: `dist.reader`, the local reader, `batch`, framework adapters."""
