"""One module per stage of the pipeline: `run_<stage>(cfg)` reads its inputs, calls core/ and
runtime/, writes its outputs and metrics. The stage table (spec.stages) names them."""
