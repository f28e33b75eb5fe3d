"""Reference figures: every GPU model's specs (data/gpu_specs.csv, every row sourced), NVIDIA's Xid
table (data/xid.csv) and the CUDA release tables (cuda.py). Pure data and lookups, so bench, judge
and report may all read them; nothing here touches the machine."""
