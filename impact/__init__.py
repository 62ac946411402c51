"""`forgive impact`: what a run's forgiven loss does to a real model trained on the CPU.

The run's loss record (workload.lossrecord) says which gradient bytes each rank
went without, per step and per ring hop. This package replays that loss into a
PyTorch model trained by as many data-parallel replicas as the run had ranks,
all-reducing their gradients chunk by chunk along the same ring, and compares
it with loss of other shapes at the same rate. Only `commands.impact` is imported by
the `forgive` command; everything else needs the optional `impact` extra.
"""
