"""Session records outside any one process: the change log, the shard actors that hold it, their on-disk journal."""
