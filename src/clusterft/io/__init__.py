"""File formats and files: atomic writes, the data files, the records stages hand each
other (selection, plan, quotas, moments, probe), shards, the run lock and the checks of a
config against the filesystem."""
