"""The run machinery above both engines: sweeps of runs (in order, in worker processes or on
Dask), the run cache, collecting a run's records into its result, the results folder with its
table and plots, and the command-line options that name a fabric and its regime."""
