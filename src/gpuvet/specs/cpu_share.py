"""When a CPU measurement shared its cores: a threshold the CPU feed's judge and the comparison of
runs (run_noise) both apply, kept below both."""

# Workers that got less CPU time than this per second of wall time shared their cores with
# other load or a hypervisor: the figure understates what an idle machine does.
LOW_CPU_SHARE = 0.8
