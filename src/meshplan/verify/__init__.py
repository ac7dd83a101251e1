"""Verification against real execution: meshplan's predictions next to what torch measures.

``meshplan.verify`` is the only part of meshplan that imports ``torch`` and ``transformers`` (the
``verify`` extra: ``pip install 'meshplan[verify]'``). One module per concern:

* :mod:`~meshplan.verify.build`   — the Hugging Face model for a :class:`~meshplan.specs.model.ModelSpec`
  (config.json written from the spec, built on the meta device or under FakeTensorMode);
* :mod:`~meshplan.verify.flops`   — FlopCounterMode over forward + backward of one micro-batch;
* :mod:`~meshplan.verify.memory`  — MemTracker (one device) and FSDPMemTracker (FSDP2 / TP / both on a
  fake process group, or real ranks on GPUs) over two optimizer steps (run by
  :mod:`~meshplan.verify.memory_trackers`), against meshplan's memory;
* :mod:`~meshplan.verify.comm`    — one training step per rank on a gloo CPU (or NCCL GPU) process group (DDP, FSDP2,
  TP, TP + SP, pipelining schedules and their combinations) with every collective counted;
* :mod:`~meshplan.verify.layout`  — the torch layout both lay out: stage module, TP plan, FSDP2 units,
  optimizer, device mesh;
* :mod:`~meshplan.verify.launch`  — the spawned workers, one per rank, that run comm's and memory's tasks;
* :mod:`~meshplan.verify.predict` — the collectives meshplan's model charges for the same plan;
* :mod:`~meshplan.verify.compare` — side-by-side rows with the tolerances of the comparison;
* :mod:`~meshplan.verify.device`  — where it runs: CPU with gloo (the default) or one CUDA GPU per rank
  with NCCL, and the refusals when the GPUs are missing;
* :mod:`~meshplan.verify.kernels` — one layer's kernel times on a GPU against the compute model, and the
  calibration constants they imply; :mod:`~meshplan.verify.llama_block` — torchtitan's Llama block
  it times (and whose saved tensors the activation tests count);
* :mod:`~meshplan.verify.allocator` — torch's allocation trace replayed through a model of the CUDA
  caching allocator (reserved against allocated bytes).

Import the submodules you need; this package file imports nothing heavy.
"""
