"""Planning (pure): placement, ports, rendering of every process and the sbatch text, capacity."""
