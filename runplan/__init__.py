"""What a run is, compiled once: the fabric descriptions (presets, fabric files, the scaling
rule) and the run plan both engines run (`runplan.run.plan_run`: one entry per rank)."""
