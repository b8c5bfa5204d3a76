"""How stages are run: one launcher (in process or under torchrun), the experiment grid,
and the generated DVC files."""
