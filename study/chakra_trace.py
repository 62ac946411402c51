"""Write a training job's Chakra execution traces, one per NPU, with Chakra's own library.

Run by `study.astra` in a Python that has Chakra installed (Chakra is in no registry; the
ASTRA-sim build of docs/astra-sim.md installs it into a venv of its own), so it imports
nothing of this project: it reads one JSON job on stdin and writes `<prefix>.<npu>.et`.

Per step, every NPU runs: a compute node of the job's compute time; the tensor-parallel
all-to-all (an ALL_TO_ALL collective on the first logical dimension) when the job has one;
then the gradient all-reduce (an ALL_REDUCE collective on every dimension), which waits for
the compute and the all-to-all; the next step's compute waits for the all-reduce. Node and
attribute names are the ones Chakra's et_generator writes (et_def 0.0.4).

    {"prefix": "DIR/job", "npus": 64, "dims": 1, "steps": 5, "compute_us": 500,
     "allreduce_bytes": 2097152, "alltoall_bytes": 0}
"""

from __future__ import annotations

import json
import sys

from chakra.et_def.et_def_pb2 import (
    ALL_REDUCE,
    ALL_TO_ALL,
    COMM_COLL_NODE,
    COMP_NODE,
    BoolList,
    GlobalMetadata,
)
from chakra.et_def.et_def_pb2 import AttributeProto as Attr
from chakra.et_def.et_def_pb2 import Node as ChakraNode
from chakra.third_party.utils.protolib import encodeMessage as encode_message


def _collective(node_id: int, name: str, kind: int, size: int, dims: list[bool]) -> ChakraNode:
    node = ChakraNode(id=node_id, name=name, type=COMM_COLL_NODE)
    node.attr.append(Attr(name="is_cpu_op", bool_val=False))
    node.attr.append(Attr(name="comm_type", int64_val=kind))
    node.attr.append(Attr(name="comm_size", uint64_val=size))
    node.attr.append(Attr(name="involved_dim", bool_list=BoolList(values=dims)))
    return node


def write(job: dict) -> list[str]:
    """Write every NPU's trace; the files written."""
    dims = int(job["dims"])
    written = []
    for npu in range(int(job["npus"])):
        path = f"{job['prefix']}.{npu}.et"
        with open(path, "wb") as et:
            encode_message(et, GlobalMetadata(version="0.0.4"))
            node_id, previous = 0, None
            for step in range(1, int(job["steps"]) + 1):
                compute = ChakraNode(id=node_id, name=f"compute step {step}", type=COMP_NODE)
                compute.attr.append(Attr(name="is_cpu_op", bool_val=False))
                compute.duration_micros = int(job["compute_us"])
                if previous is not None:
                    compute.data_deps.append(previous)
                encode_message(et, compute)
                waits = [compute.id]
                node_id += 1
                if job["alltoall_bytes"]:
                    tp = _collective(
                        node_id,
                        f"tensor-parallel step {step}",
                        ALL_TO_ALL,
                        int(job["alltoall_bytes"]),
                        [True] + [False] * (dims - 1),
                    )
                    tp.data_deps.append(compute.id)
                    encode_message(et, tp)
                    waits.append(tp.id)
                    node_id += 1
                ar = _collective(
                    node_id,
                    f"gradient all-reduce step {step}",
                    ALL_REDUCE,
                    int(job["allreduce_bytes"]),
                    [True] * dims,
                )
                ar.data_deps.extend(waits)
                encode_message(et, ar)
                previous = ar.id
                node_id += 1
        written.append(path)
    return written


if __name__ == "__main__":
    files = write(json.load(sys.stdin))
    print(f"{len(files)} traces written", file=sys.stderr)
