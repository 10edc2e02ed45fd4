"""Many images as one plan: ordered so shared layers are built once, the next build overlapping the current test,
each image pushed as soon as it passed and freed once nothing later needs it (run.pipeline.ship), on one engine
or split across several (run.pipeline.engines)."""
