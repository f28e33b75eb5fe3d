"""Fleet mode: `gpuvet health`, the passive check a scheduler runs on every node (Slurm's
HealthCheckProgram, Kubernetes node-problem-detector), and what it does to the node (drain,
resume) with the scheduler's own tools."""
