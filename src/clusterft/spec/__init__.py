"""What clusterft is made of, declared once: the config (every param, its type, range and
help), the method table and the stage table. Data only; every other layer reads it."""
