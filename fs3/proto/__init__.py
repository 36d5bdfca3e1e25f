"""Generated protobuf and gRPC modules of proto/*.proto (regenerate with ``make proto``)."""
