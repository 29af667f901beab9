"""What a worker trains on: the job's data and model built once per join (job_build.py), the largest
batch its memory holds (memory_probe.py), the batches read ahead by a loader (loader.py), drawn by the
elastic sampler (sampler.py) or taken from the server's slices of an exact epoch (slices.py). May
import common, worker.transport and worker.probes; never protos."""
