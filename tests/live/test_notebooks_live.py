"""Every notebook in notebooks/ runs end to end, headless, with the jaxsys kernel."""

from __future__ import annotations

import os
import re
import tempfile

import nbformat
import pytest

from ..executed import executed
from ..unit.test_notebooks import EXPLAINED, NOTEBOOKS, clean_run_problems

# Lines a notebook's outputs must contain: proof that it shows what its prose says.
EXPECTED = {
    "01-meshes-and-shardings.ipynb": [
        "assembled correctly: True",
        "[496.0, 496.0, 496.0, 496.0, 496.0]",
        "same devices in the same places as `mesh`: True",
        # a matmul picks a layout neither input had; replicate before reading
        "product: P('data',)",
        # the sharding view's text form, for readers without widgets
        "P('data',) over shape (8, 8): 4 blocks of shape (2, 8), x2 replicated, processes p0-3",
        "[p0-3] matches NumPy: True",
        # a mesh over half the devices: processes 0 and 1 hold nothing
        "[p0-1] my shards: []",
        "[p0-1] result's shards here: [] | fully addressable: False",
        # the computation on its participants alone
        "[p2-3] on processes 2 and 3 alone: ",
        # addressable_shards is no attribute of a traced array
        "[p0-3] addressable_shards under jit: ConcretizationTypeError - The 'addressable_shards'",
        "[p0-3] equals the original: True",
        # an array over processes 0 and 1 only: the others pass arrays=[]
        "[p0] blocks passed: 2 | shards held: [[[0]], [[1]]]",
        "[p2-3] blocks passed: 0 | shards held: []",
        "[p0-3] exercise 1: correct",
        "[p0-3] exercise 2: correct",
    ],
    "00-quickstart.ipynb": [
        # the toy program by hand: two plain processes, each calling initialize itself
        "process 1 of 2: devices 2 of 4, global shape (4, 4) | sum: 8.0",
        "[p0-3] local devices: 2, devices in the world: 8",
        # the mesh view's text form, beside its picture
        "Mesh(x=8): 8 devices of processes p0-3; devices [0, 1, 2048, 2049, 4096",
        "[p0-3] sum: 48.0 mean: 1.5",
        "as expected: True",
        "JAX imported in the kernel: False",
        "[p3] 30",
        # errors grouped by process: p1 and p3 raised, the others printed
        "[p0] 1 / scale = 1.0",
        # the same computation as one process with all 8 devices
        "processes: 1 | devices: 8 | sum: 48.0 mean: 1.5",
        # initialize after a device call is refused
        "RuntimeError: jax.distributed.initialize() must be called before any JAX calls",
        # --explain: the call each process made
        "    process_id=1,",
        # initialize() without arguments, from the SLURM_* variables
        "process 1 of 2, devices in the world: 2",
        # the exercises' checks pass with the answers shipped
        "[p0-1] exercise 1: correct",
        "[p0-1] exercise 2: correct, process 0",
    ],
    "02-data-loading.ipynb": [
        # a model replica on one process's two devices, in plain JAX
        "[p0-3] plain JAX, one read per process:",
        "[p0-3] values match the file: True",
        # plain JAX first: option 1 keeps a quarter of what it read; then counted
        "[p0-3] read 2.0 MiB, kept 0.5 MiB on my devices",
        "| read 4.00 x the batch",
        "[p0-3] global_batch built the same batch: True",
        # pure data parallelism: a quarter each, the batch read once in all
        "[p0-3] share of the bytes read: [0.25, 0.25, 0.25, 0.25] | read 1.00 x the batch",
        "[p0-3] p3: read 512.0 KiB (524288 bytes) in 1 slice, 1 batch",
        "[p0-3] largest value, found across all processes: 524287.0",
        # one pipeline per device reads replicated rows twice
        "[p0-3] p0: read 1.0 MiB (1048576 bytes) in 2 slices, 1 batch",
        "[p0-3] layout after the reshard: P(None, 'batch')",
        "  p0       d0-1        1      512   512.0 KiB  25.0%  -",
        "[p3] examples in my rows of batch 1: [19, 23, 27, 31]",
        "[p0,2] my rows of the Grain batch start with examples [0, 8]",
        "[p0-3] processes that must read the same rows: [(0, 2), (1, 3)]",
        # the plan views (their text form): partners named, half the batch each
        "  p0       d0-1        1      1     1.0 MiB  50.0%  p1",
        "  p3       d6144-6145  1      1     1.0 MiB  50.0%  p1",
        "[p2-3] sum of the 'replicated' batch: 160.0",
        # plain JAX before each helper: one read per device, so replicated slices twice
        "[p0-3] plain JAX read 0.50 MiB for my 2 devices",
        "[p0-3] read 0.50 MiB in one run",
        "[p0-3] plain JAX read 4.00 MiB for my 2 devices",
        "[p0-3] plain JAX read 2.00 MiB for my 2 devices",
        "[p0-3] plain JAX read 1.00 MiB for my 2 devices",
        "[p0-3] exercise 1: correct",
    ],
    "03-fault-tolerance.ipynb": [
        # Without process prefixes: survivors may see the failure a collation window apart.
        "ProcessFailureError: lost devices [6144]",
        # the set handed out on entry still holds the process that died after the last barrier
        "live_devices hands out: [0, 2048, 4096, 6144]",
        "process 0 hosts JAX's coordination service",
        "checkpoint restored: step 10",
        "jaxsys hang doctor: p2 failed",
        "checkpoint restored: step 14",
        # fate-sharing without recoverability: process 0 goes down with process 1
        "process 0 is dead",
        # a death inside a step: every survivor runs the except branch
        "[p0-2] step 19 abandoned: lost devices [6144]",
        # JAX's handover: an all-gather of steps spots the newcomer, a shard_map sum sends it
        # process 0's state (all four print one line, so all four hold the same weights)
        "[p0-3] steps by process: {0: 18, 1: 18, 2: 18, 3: 0} | newcomers: [3]",
        "[p0-3] after the handover: step 18, weights [",
        "exercise 1: all three cases pass",
        # the notebook runs with a standby (tests/executed.py): restarts swap it in
        "s (from the standby)",
        "(4 from the standby)",
    ],
    "05-export-and-shape-polymorphism.ipynb": [
        "[p0-1] exercise 1: correct",
        "f32[4*b, 16]",
        "b >= 1, b <= 256",
        "no (exported for cuda, tpu; this process is cpu)",
        "[p0-1] in: float32[4*b,16] -> out: float32[8*b,16]",
        "this jaxlib accepts 9 to 10",
        "p0 batch 1000: (1000, 2), my rows match NumPy: True",
        "p1 batch 1000: (1000, 2), my rows match NumPy: True",
        # plain JAX first: serialize, deserialize, call; then vjp_order and an executable
        "plain deserialize, then call: (8, 2)",
        "grad with vjp_order=1 matches jax.grad: True",
        "jvp of the rehydrated function: TypeError",
        "vmap of it: NotImplementedError",
        # a swapped artifact runs without a word
        "the sin file: 0.84",
        "after the swap: 1000.0",
        # shardings name logical devices: an AbstractMesh export called on other devices
        "nr_devices: 2 | on my devices, reversed: True | [7, 6, 5, 4, 3, 2, 1, 0]",
        "exported for 1 device, called on 2 devices: [0, 2, 4, 6, 8, 10, 12, 14]",
        "run here with the platform check disabled: 0.5403",
        "platforms: ('cpu', 'cuda') | runs here: True",
        "same result: True",
        # .call in a new jit, custom calls, the dumped modules, the old module's names
        "call inside a new jit: (8,) int32 | the artifact is a function in it: True",
        "eigh exports, with the stable target ['lapack_ssyevd_ffi']",
        "with the check disabled: (custom_call:my_norm,) | called here: JaxRuntimeError: NOT_FOUND",
        "The module was dumped to jax_ir",
        "_jit_loss_export.mlir",
        "import jax.experimental.export: ModuleNotFoundError",
        "default_export_platform(): cpu",
    ],
    "06-compilation-cache.ipynb": [
        "[p0-1] exercise 1: correct",
        # the cache runs what an entry holds: swapped files, swapped functions
        "after swap: plus_one(2) = 20.0 | times_ten(2) = 3.0",
        "jit_train_step",
        "p1: not served by the cache: on CPU",
        "p0: served. 2 request(s): 2 hit(s), 0 shared, 0 compiled here",
        "jit_train_step is cached under another key",
        "below the 30 s minimum",
        "jaxsys: removed",
        # the cache in a standalone program: three ways to name it, JAX's own logs
        "set_cache_dir: 2 entries for f, one per shape",
        "Persistent compilation cache hit for 'jit__lambda'",
        "* at x, now f32[32,64] and before f32[64,64]",
        # custom_partitioning: a new key in every run
        "after run 2: 2 entries for the same function",
        # the size threshold run three ways; the shard_map workaround keeps one key
        "min size         0: 2 entries for f | in effect after the first compile: 0",
        "min size 100000000: 0 entries for f",
        "with shard_map, after run 2: 1 entry for the same function",
    ],
    "06b-compilation-cache-dashboard.ipynb": [
        "[p0] exercise 1: correct, 3 programs read back",
        # a training loop that recompiles
        "learned w: [ 2.  -1.   0.5  3. ]",
    ],
    "03b-deaths-recoverability-cannot-absorb.ipynb": [
        "exercise 1: correct",
        "[p0-2] sum over all three processes: 12.0",
        # one survivor hears from gloo, the other waits in the collective; the dead peer's
        # socket is closed or, with data still unread in it, reset, as the kill falls
        ("Connection closed by peer", "Connection reset by peer"),
        "still running: p0",
        # process 0's death takes the others with it, recoverability on
        "{0: 'dead', 1: 'dead', 2: 'dead'}",
    ],
    "05b-shape-polymorphism.ipynb": [
        # the exercise's check passes with the answer shipped: one export, 8 and 12 rows
        "[p0] exercise 1: correct, input shape (4*k, 3)",
        "reshape (b, 6) -> (-1, 2): float32[3*b,2]",
        "10 x the length of a 7-vector: 70",
        "Python max: InconclusiveDimensionOperation",
        "1. max_dim: float32[max(b, 8)]",
        "3*a*c is 3*d",
        "two scopes: ValueError: Invalid mixing of symbolic scopes",
        "b == 1: False | b != 1: True",
        # an `== 1` guard leaves the export; a `!= 1` guard makes the export raise
        "== 1 guard | jit: ValueError: size 1 is not allowed | exported, called with b = 1: (1, 2)",
        "!= 1 guard | export: ValueError: size 1 only",
        "k as a symbol: UnexpectedDimVar",
        "called with 5: ValueError: Input shapes do not match the polymorphic shapes specification.",
        # refinement logged: symbolic tensors before the pass, none after
        "after StablehloRefineShapesPass: 0 tensors with a symbolic dimension",
    ],
    "09-divergence-and-timelines.ipynb": [
        # the exercise's check: every process uses process 0's batch size
        "[p0-3] exercise 1: correct, batch size 16",
        # %jaxsys where names the process %jaxsys slow delayed, and where its time went
        "jaxsys: p1 held the others up, in host (5 steps)",
    ],
    "07-transfer-guard.ipynb": [
        "[p0-1] exercise 1: correct",
        "explicit jax.device_put under log_explicit: ran",
        # a refusal per process, naming its own device
        "host-to-device transfer of shape (8), dtype float32, from host memory to device cpu:",
        # identical refusals are shown once, the values that differ listed per process (a
        # value the message names twice, once under both names)
        "cpu/id: 0 on p0, 2048 on p1",
        # a sharded read is gathered through the first device, which JAX names
        "device-to-host transfer of shape (8), dtype float32, from device cpu:",
        "[p0-1] read back under disallow: 28.0 | as NumPy: [0.0, 1.0, 2.0]",
        "guard_lib.cc:154] host-to-device transfer: aval=ShapedArray(float32[8])",
        "[p0-1] transfer guard h2d=log d2h=log d2d=log; logged transfers: 6 h2d, 0 d2h, 0 d2d",
        "[p0-1] device-to-host still allowed: 56.0",
        # plain JAX: the thread-local rule and a device-to-device copy
        "with block, a new thread: ran",
        "process-wide, a new thread: refused",
        "explicit: ran",
    ],
    "08-threads-pipelines-and-multihost-utils.ipynb": [
        "[p0-1] exercise 1: correct, [0, 1]",
        "[p1] stage-one output has local data here: False",
        "[p1] matches NumPy: True",
        # the thread guard in plain JAX; a pipeline overlapped without threads
        "one-device sum in the worker: 6.0",
        "the loop only queued work: True",
        # the same microbatched loop across the two processes
        "[p1] stage-two outputs match NumPy: True",
        "sync_global_devices name mismatch ('after-step-",
        "in thread 'stage-2-worker'",
        "[p0-1] sums computed on the cell's thread: [0.0, 4.0, 8.0]",
        "[p1] proposed: 1001 | agreed: 1000",
        "stacked (3,) -> (2, 3) [[0, 0, 0], [1, 1, 1]] | tiled scalar -> (2,)",
        "[p0] with 1 process: stacked (3,) -> (1, 3) | tiled scalar -> ()",
        "each process's id",
        "[p0-1] back to my rows: True",
        "jaxsys: barrier 'checkpoint-written' passed by p0-1",
        "[p0] waiting at barrier 'held-back': arrived p0; missing p1",
        "barrier 'held-back' timed out after 2 s: p1 never arrived (arrived: p0)",
        "jaxsys: barrier 'after-the-wait' passed by p0-1",
        "in the thread started inside the trace: UnexpectedTracerError",
        # --explain: the transfer socket as the plain-JAX line each process ran
        "jax.config.update('jax_cross_host_transfer_socket_address', '127.0.0.1:",
    ],
    "10-train-through-failures.ipynb": [
        "[p0-1] mesh {'data': 2, 'model': 2}",
        "[p0-1] reference: step 12 fingerprint ",
        # the kill, its retry and the resumed run
        "jaxsys: --retries: process 1 died",
        "world restarted in ",
        "bitwise equal: True",
        # the training chart's text form: the fault's recovery, phase by phase
        "fault 1: process 1 died",
        "first good step +",
        # the preemption notice: sent, and the same step saved on both processes
        "jaxsys: sent SIGTERM to process 1: a preemption notice.",
        "[p0-1] preempted: True | saved step ",
    ],
    "04-security.ipynb": [
        "exercise 1: correct",
        "did it join? False",
        "connection(s) from 127.0.0.1: it hung up during the handshake",
        "from 127.0.0.1: it presented no certificate",
        "[p0-1] sum over both processes: 3.0",
        "[p0-1] peer URI prefix: spiffe://jaxsys.local/mylab/",
        "connection with process 1's new certificate: accepted",
        # any mTLS setting makes an incomplete set-up an error; the prefix needs its '/'
        "certificate only:        JaxRuntimeError: INVALID_ARGUMENT: mTLS configuration is missing",
        "prefix without its '/':  JaxRuntimeError: INVALID_ARGUMENT: mTLS peer_uri_prefix must end",
        "no mTLS, check required: aborted (signal 6)",
        # without a prefix the client checks the coordinator's host name
        "no prefix, at 127.0.0.1: initialized",
        "no prefix, at 127.0.0.2: DEADLINE_EXCEEDED",
        "prefix, at 127.0.0.2:    initialized",
        # the cluster's own CA, but a URI outside the prefix: refused, and reported as such
        "the outsider:   refused (it hung up)",
        "process 1:      accepted",
        "for an identity outside this cluster",
        # an open coordinator: one unauthenticated process claiming id 1 ends the real one
        "process 0 ready, process 1 dead",
    ],
}


# Pictures a saved notebook must show without widgets: the views' static PNG pictures (or a
# data plan's SVG).
STATIC_PICTURES = {
    "00-quickstart.ipynb": 1,
    "01-meshes-and-shardings.ipynb": 8,
    "06b-compilation-cache-dashboard.ipynb": 2,
    "10-train-through-failures.ipynb": 1,
}


def _svg_outputs(nb) -> int:
    return sum(
        "image/png" in o.get("data", {}) or "<svg" in o.get("data", {}).get("text/html", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )


def _alternatives(line: str | tuple[str, ...]) -> tuple[str, ...]:
    return line if isinstance(line, tuple) else (line,)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _output_text(nb) -> str:
    """Every output's text, error tracebacks included (without their colours)."""
    return "\n".join(
        o.get("text", "")
        or o.get("data", {}).get("text/plain", "")
        or _ANSI.sub("", "\n".join(o.get("traceback", [])))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tag):
    # The executed copy is the one the course site's test renders (tests/executed.py).
    nb = nbformat.read(executed(path), as_version=4)
    text = _output_text(nb)
    for line in EXPECTED.get(path.name, []):
        # A tuple: any one of its lines will do.
        assert any(one in text for one in _alternatives(line)), f"{path.name}: missing {line!r}"
    assert "[Gloo]" not in text
    assert _svg_outputs(nb) >= STATIC_PICTURES.get(path.name, 0), (
        f"{path.name}: static views missing"
    )
    if path.name in SCRATCH:
        assert "scratch files left: []" in text, f"{path.name} leaves scratch files"
    assert not _scratch_left(path), f"{path.name} left {_scratch_left(path)}"
    problems = clean_run_problems(nb, EXPLAINED.get(path.name, []))
    assert not problems, f"{path.name} is not a clean run:\n" + "\n".join(problems)


# Notebooks that write scratch files in the temporary directory, and the prefix of their names:
# each must remove them, and its last cell checks (and prints) that none is left.
SCRATCH = {
    "05-export-and-shape-polymorphism.ipynb": "jaxsys-05-",
    "05b-shape-polymorphism.ipynb": "jaxsys-05b-",
    # Not "jaxsys-06-": notebook 06b's dashboard cache is "jaxsys-06-dash-".
    "06-compilation-cache.ipynb": ("jaxsys-06-plain-", "jaxsys-06-cache-"),
}


def _scratch_left(path) -> list[str]:
    """The scratch files of notebook ``path`` still in the temporary directory."""
    prefix = SCRATCH.get(path.name)
    if prefix is None:
        return []
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix)]  # str or tuple


def test_notebooks_hold_the_language_info_of_a_real_kernel_info_reply():
    # What JupyterLab compares on open: a notebook whose language_info differs from the
    # running kernel's reply is marked modified, and autosave rewrites the tracked file.
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="jaxsys")
    try:
        reply = client.kernel_info(reply=True, timeout=60)["content"]["language_info"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    for path in NOTEBOOKS:
        stored = nbformat.read(path, as_version=4).metadata.get("language_info")
        assert stored == reply, f"{path.name}: {stored} is not the kernel's {reply}"
