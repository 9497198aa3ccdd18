"""The engine replica's upkeep: its steady report to the central scheduler, the stats Serve asks of
it (routing, autoscaling, health), and the sessions it aborts on its own (idle past the TTL, left by their reader and not taken over within the
resume grace, or whose driving ingress is gone). A mixin of `EngineReplica`, whose state it reads."""

from __future__ import annotations

import asyncio
import logging
import time

from engine.api import SessionNotFoundError

log = logging.getLogger("stream2llm.replica")


class ReplicaUpkeep:
    async def _report_loop(self) -> None:
        interval = self._config.replicas.report_interval_s
        while True:
            try:
                await self._expire_idle()
                await self._report()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler may be restarting: report again next round
                log.warning("report to the central scheduler failed: %r", e)
            await asyncio.sleep(interval)

    async def _report(self) -> None:
        stats = await self._fresh_stats()
        sessions, complete = {}, []
        for sid in list(self._touched):
            try:
                session = self._engine.session_stats(sid)
            except SessionNotFoundError:
                self._forget(sid)
                continue
            sessions[sid] = session.context_tokens
            if session.finish_at is not None:
                complete.append(sid)
        report = {
            "replica_id": self.replica_id, "kv_blocks_total": stats["kv_blocks_total"],
            "kv_blocks_used": stats["kv_blocks_used"], "block_size": stats["block_size"],
            "sessions_active": stats["sessions_active"], "sessions_idle": stats["sessions_idle"],
            "queue_depth": len(self._busy), "sessions": sessions,
            "source_types": {s: self._source.get(s, "") for s in sessions},
            "node_id": self.node_id, "preemptions": stats["preemptions"],
            "max_num_seqs": self._config.model.max_num_seqs, "running": int(stats["extra"].get("running", 0)),
            "waiting": int(stats["extra"].get("waiting", 0)), "complete": complete,
        }
        self._pressure = await self._scheduler.report.remote(report)

    async def _expire_idle(self) -> None:
        self._answers.expire()
        ttl = self._config.limits.session_ttl_s
        now = time.monotonic()
        idle = {sid: now - touched for sid, touched in self._touched.items() if sid not in self._busy}
        for sid, idle_s in idle.items():
            if idle_s > ttl:
                log.info("aborting session %s: idle for %.1f s (TTL %.1f s)", sid, idle_s, ttl)
                await self._drop(sid)
        for sid in [s for s, deadline in self._detached.items() if deadline < now]:
            log.info("aborting session %s: its retrieval lost its reader and nobody took it over", sid)
            await self._drop(sid)
        for sid in await self._owners.orphans(s for s, idle_s in idle.items() if self._orphan_after_s < idle_s <= ttl):
            log.warning("aborting session %s: the ingress replica that drove it is gone", sid)
            await self._drop(sid)

    async def _drop(self, session_id: str) -> None:
        await self.abort(session_id)
        await self._scheduler.release.remote(session_id)  # else the central actor keeps counting it

    def record_routing_stats(self) -> dict:
        return dict(self._last_stats)

    def record_autoscaling_stats(self) -> dict:
        """Custom metrics for `pipeline.control.autoscale.KVPressurePolicy`: this engine's real KV
        use, and the central scheduler's load (real KV, sequence slots) and admission queue."""
        total = self._last_stats.get("kv_blocks_total") or 1
        return {
            "kv_used_frac": self._last_stats.get("kv_blocks_used", 0) / total,
            "cluster_load_frac": float(self._pressure.get("load_frac", 0.0)),
            "cluster_queued": float(self._pressure.get("queued", 0)),
        }

    async def check_health(self) -> None:
        """Serve replaces the replica when its engine died (e.g. EngineDeadError)."""
        if self._reporter.done() and not self._reporter.cancelled():
            raise RuntimeError(f"report loop stopped: {self._reporter.exception()!r}")
        await asyncio.wait_for(self._engine.stats(), timeout=10)
