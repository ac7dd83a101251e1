"""The calculators of the source documents, as library functions (``meshplan calc …`` calls them).

One module per concern; each function returns a :class:`~meshplan.calc.result.CalcResult` with
its figures (SI units), the derivation of each figure and notes:

===============  ==============================================================================
module           what it computes
===============  ==============================================================================
collective       one collective (ring, tree, hierarchical): steps, bytes per GPU, time, algbw,
                 busbw, ring/tree crossover; a ring all-reduce run step by step on numpy arrays
overlap          communication hidden behind compute: bucketed all-reduce, FSDP prefetch, MFU
checkpoint       checkpoint size and write time, Young and Daly intervals, waste, cost per
                 crash; ZeRO per-GPU model state
failures         cluster MTBF, the expected run time under failures (Daly) and its Monte Carlo
run_length       a plan's run with failures: MTBF from the GPU count at a published rate,
                 checkpoint from the plan, Daly's interval, expected days and a p10–p90 range
batch            gradient accumulation, step time, critical-batch efficiency
lr               LR scaling, warmup, warmup + cosine schedules with a batch ramp (Llama 3)
formats          floating-point formats from their bit layout; rounding; tensor sizes
loss_scale       dynamic loss scaling (GradScaler)
roofline         arithmetic intensity, ridge point, attainable FLOP/s
cost             GPU-hours, dollars, energy for a run or a token budget
plots            the pictures (matplotlib, optional)
===============  ==============================================================================

Communication times come from :mod:`meshplan.cost.collectives`, model state from
:mod:`meshplan.cost.memory`, bytes per parameter from :class:`~meshplan.specs.plan.PrecisionRecipe`,
GPUs from the catalog: the calculators and ``meshplan estimate`` share one model.
"""
