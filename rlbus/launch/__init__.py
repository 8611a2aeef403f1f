"""Running rlbus on one machine: the roles of a run as supervised child processes
(`supervisor`), the live dashboard of `rlbus run` (`dashboard`), the sink that commands wait on
(`local_sink`), and `rlbus eval`'s pipeline with its summary (`evaluation`). Roles never import
this package."""
