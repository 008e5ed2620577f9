"""Read pre-deployment profiling results (NVIDIA Dynamo NPZ files) into an EngineProfile.

Two layouts:

* profiler output: <dir>/selected_prefill_interpolation/raw_data.npz and
  <dir>/selected_decode_interpolation/raw_data.npz, 1-D arrays;
* pre-swept: <dir>/prefill.npz and <dir>/decode.npz, every array with a
  leading row axis (one row per parallel config) and config columns
  (gpu_type, tp, ...); a row is picked by tensor-parallel size and GPU type.

A profiler folder's meta.json, when there is one, gives the GPUs per engine
(num_gpus_prefill_engine / num_gpus_decode_engine, else tp_prefill / tp_decode);
a pre-swept row's are its TP sizes. Throughputs are per GPU, so an engine of N
GPUs serves N times one GPU's.

Files are opened with allow_pickle=False. Errors name the file and the key.
"""

from __future__ import annotations

import json
import threading
import zipfile
from pathlib import Path

import numpy as np

from planner.config import ProfileConfig
from planner.latency.decode_profile import DecodeProfile
from planner.latency.profile import EngineProfile, PrefillProfile
from planner.latency.profile_checks import OutOfRange

META_FILE = "meta.json"
PREFILL_FILE = Path("selected_prefill_interpolation") / "raw_data.npz"
DECODE_FILE = Path("selected_decode_interpolation") / "raw_data.npz"

_DATA_KEYS = {
    "prefill": ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"),
    "decode": ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens"),
}

# numpy parses every array header with ast.literal_eval, and CPython 3.11 keeps the AST
# constructor's recursion counter in state shared by all threads: two threads reading .npz
# files at once (a what-if sweep's task runner) can fail with "SystemError: AST constructor
# recursion depth mismatch". Reads therefore take turns.
_READ_LOCK = threading.Lock()


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file (no pickles); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: profile file not found")
    try:
        with _READ_LOCK, np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz file: {exc}") from None


def load_profile_dir(path: str | Path, *, out_of_range: OutOfRange = "clip") -> EngineProfile:
    """Load a Dynamo profiler output folder (selected_*_interpolation/raw_data.npz)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: profile folder not found")
    pf, df = path / PREFILL_FILE, path / DECODE_FILE
    prefill = PrefillProfile.from_arrays(read_npz(pf), source=str(pf), out_of_range=out_of_range)
    decode = DecodeProfile.from_arrays(read_npz(df), source=str(df), out_of_range=out_of_range)
    gpus = read_engine_gpus(path / META_FILE)
    return EngineProfile(prefill=prefill, decode=decode, name=path.name,
                         gpus_per_prefill_engine=gpus["prefill"], gpus_per_decode_engine=gpus["decode"])


def read_engine_gpus(path: Path) -> dict[str, int | None]:
    """GPUs per prefill and decode engine from a profile's meta.json (num_gpus_<role>_engine, else
    tp_<role>); None for a role it does not name, or when there is no such file."""
    out: dict[str, int | None] = {"prefill": None, "decode": None}
    if not path.is_file():
        return out
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    for role in out:
        for key in (f"num_gpus_{role}_engine", f"tp_{role}"):
            if key not in meta:
                continue
            v = meta[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{path}: {key} must be an integer >= 1, got {v!r}")
            out[role] = v
            break
    return out


def _column(arrays: dict[str, np.ndarray], key: str, *, source: Path, rows: int) -> list:
    if key not in arrays:
        raise ValueError(f"{source}: missing key {key!r} (has {sorted(arrays)})")
    a = np.asarray(arrays[key])
    if a.shape[:1] != (rows,) or a.size != rows:
        raise ValueError(f"{source}: key {key!r} must have one value per row ({rows}), got shape {a.shape}")
    return a.reshape(rows).tolist()


def _select_row(
    arrays: dict[str, np.ndarray], *, source: Path, kind: str, tp: int, gpu_type: str | None
) -> tuple[dict[str, np.ndarray], str]:
    """The row of a pre-swept file with this tp (and gpu_type); 1-D arrays plus a label."""
    first = _DATA_KEYS[kind][0]
    if first not in arrays:
        raise ValueError(f"{source}: missing key {first!r} (has {sorted(arrays)})")
    if np.asarray(arrays[first]).ndim != 2:
        raise ValueError(
            f"{source}: key {first!r} must be 2-D (row per parallel config), got shape {np.asarray(arrays[first]).shape}"
        )
    rows = np.asarray(arrays[first]).shape[0]
    tps = _column(arrays, "tp", source=source, rows=rows)
    gpus = _column(arrays, "gpu_type", source=source, rows=rows)
    models = _column(arrays, "model", source=source, rows=rows) if "model" in arrays else ["?"] * rows
    matches = [
        r for r in range(rows)
        if int(tps[r]) == tp and (gpu_type is None or str(gpus[r]).lower() == gpu_type.lower())
    ]
    if not matches:
        available = ", ".join(f"row {r}: tp={int(tps[r])} gpu_type={gpus[r]}" for r in range(rows))
        want = f"tp={tp}" + (f" gpu_type={gpu_type}" if gpu_type else "")
        raise ValueError(f"{source}: no row with {want}; available: {available}")
    if len(matches) > 1:
        raise ValueError(
            f"{source}: {len(matches)} rows match tp={tp}"
            + (f" gpu_type={gpu_type}" if gpu_type else "")
            + f" (rows {matches}); set gpu_type to choose one"
        )
    r = matches[0]
    out = {}
    for key in _DATA_KEYS[kind]:
        if key not in arrays:
            raise ValueError(f"{source}: missing key {key!r} (has {sorted(arrays)})")
        a = np.asarray(arrays[key])
        if a.ndim < 1 or a.shape[0] != rows:
            raise ValueError(f"{source}: key {key!r} must have a leading row axis of {rows}, got shape {a.shape}")
        out[key] = a[r].reshape(-1)
    return out, f"{models[r]}/{gpus[r]} TP{int(tps[r])}"


def load_pre_swept(
    dir: str | Path,
    *,
    prefill_tp: int,
    decode_tp: int,
    gpu_type: str | None = None,
    out_of_range: OutOfRange = "clip",
) -> EngineProfile:
    """Load one parallel config from a pre-swept folder (prefill.npz, decode.npz).

    prefill_tp / decode_tp: tensor-parallel size of the row to use in each file.
    gpu_type: also match the row's gpu_type (case-insensitive), e.g. "h200_sxm".
    """
    dir = Path(dir)
    if not dir.is_dir():
        raise ValueError(f"{dir}: pre-swept profile folder not found")
    pf, df = dir / "prefill.npz", dir / "decode.npz"
    p_arrays, p_label = _select_row(read_npz(pf), source=pf, kind="prefill", tp=prefill_tp, gpu_type=gpu_type)
    d_arrays, d_label = _select_row(read_npz(df), source=df, kind="decode", tp=decode_tp, gpu_type=gpu_type)
    prefill = PrefillProfile.from_arrays(p_arrays, source=f"{pf}[{p_label}]", out_of_range=out_of_range)
    decode = DecodeProfile.from_arrays(d_arrays, source=f"{df}[{d_label}]", out_of_range=out_of_range)
    return EngineProfile(prefill=prefill, decode=decode, name=f"prefill {p_label}, decode {d_label}",
                         gpus_per_prefill_engine=prefill_tp, gpus_per_decode_engine=decode_tp)


def load_profile(cfg: ProfileConfig) -> EngineProfile:
    """Load the profile a ProfileConfig points at (profiler folder or pre-swept row)."""
    if cfg.dir is not None:
        return load_profile_dir(cfg.dir, out_of_range=cfg.out_of_range)
    missing = [f for f in ("prefill_tp", "decode_tp") if getattr(cfg, f) is None]
    if missing:
        raise ValueError(f"profile: pre_swept_dir {cfg.pre_swept_dir} needs {' and '.join(missing)}")
    return load_pre_swept(
        cfg.pre_swept_dir,
        prefill_tp=cfg.prefill_tp,
        decode_tp=cfg.decode_tp,
        gpu_type=cfg.gpu_type,
        out_of_range=cfg.out_of_range,
    )
