"""The control plane at scale: a 32-rank job on 4 hosts (tests/support/netns_hosts.py), 8 ranks each, and its store's load.

Every rank heartbeats once a second and, every ``POLL_S`` (0.5 s), reads in one request whether a rank
failed and the next rank's heartbeat; a blocked wait asks its heartbeat, not the store. So while every
rank waits, the store answers 3 requests of at most 4 keys per rank per second, whatever the number of
ranks: 96 requests and 288 keys per second at 32 ranks (where a blocked rank reading the records of
every other rank every 0.5 s asked for 2 x 4 x 31 keys per second, 7968 in all). The job's launcher on
node 0 serves the store and logs its load each second (``--log-dir``: ``store_load.jsonl``); the test
reads the load while rank 0 keeps the other 31 ranks waiting in an all_reduce for 6 s.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from netns_hosts import testbed
from simdist.backends.socket import new_secret

__all__ = ["testbed"]  # the fixture, used below

pytestmark = pytest.mark.timeout(300)

HOSTS, PER_HOST = 4, 8
WORLD = HOSTS * PER_HOST
WAIT_S = 6.0

JOB = f"""\
import time
import torch
import simdist as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.full((1024,), float(rank))
dist.all_reduce(t)
assert t.eq(sum(range({WORLD}))).all(), t[:4]
if rank == 0:
    start = time.time()
    time.sleep({WAIT_S})  # the others wait in the all_reduce below meanwhile
    print(f"waited {{start:.3f}} {{time.time():.3f}}", flush=True)
t.fill_(1.0)
dist.all_reduce(t)
assert t.eq({WORLD}).all(), t[:4]
print(f"rank={{rank}} ok on {{dist.get_world_size()}} ranks", flush=True)
dist.destroy_process_group()
"""


def test_32_ranks_on_4_hosts_load_the_store_linearly(testbed, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    bed = testbed(HOSTS)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update({"SIMDIST_SECRET": new_secret(), "OMP_NUM_THREADS": "1"})
    options = ["--backend", "socket", "--timeout", "200", "--log-dir", f"{tmp_path}/host{{host}}"]
    nodes = bed.launch(str(script), per_host=PER_HOST, port=29720, env=env, options=options)
    ends = [node.communicate(timeout=240) for node in nodes]
    logs = {int(p.stem.split("_")[1]): p.read_text() for p in tmp_path.glob("host*/rank_*.log")}
    assert [node.returncode for node in nodes] == [0] * HOSTS, (ends, logs.get(0))
    assert sorted(logs) == list(range(WORLD))
    for rank, text in logs.items():
        assert f"rank={rank} ok on {WORLD} ranks" in text, text

    start, end = map(float, re.search(r"waited ([\d.]+) ([\d.]+)", logs[0]).groups())
    samples = [json.loads(line) for line in (tmp_path / "host0" / "store_load.jsonl").read_text().splitlines()]
    during = [s for s in samples if start + 1.0 <= s["time"] <= end - 0.5]  # every rank waits, heartbeats run
    assert len(during) >= 3, samples
    seconds = during[-1]["time"] - during[0]["time"]
    requests = (during[-1]["requests"] - during[0]["requests"]) / seconds
    keys = (during[-1]["keys"] - during[0]["keys"]) / seconds
    cpu = (during[-1]["cpu"] - during[0]["cpu"]) / seconds
    print(f"{WORLD} ranks waiting: the store served {requests:.0f} requests/s, {keys:.0f} keys/s, {cpu:.3f} CPU s/s")
    assert requests <= 4 * WORLD, f"{requests:.0f} requests/s for {WORLD} ranks: expected about 3 per rank"
    assert keys <= 12 * WORLD, f"{keys:.0f} keys/s for {WORLD} ranks: expected about 9 per rank"
