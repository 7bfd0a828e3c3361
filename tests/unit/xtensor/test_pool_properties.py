"""Property-based: random sequences of weight and KV allocations, frees, sleeps and wakes across several models on
one real CPU pool. After every step: no page is owned twice, weights and KV never overlap, the counters add up, and
data written through each model's views is read back through the global region at the offsets the pool reports,
including after compaction has moved pages under the views."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from worker.xtensor import KV_CACHED, PoolExhaustedError, XTensor, XTensorError

from .xtensor_fixtures import TEST_PAGE_BYTES, make_config

OWNERS = ("a", "b", "c")
NUM_POOL_PAGES = 40
MAX_KV_PAGES = 12
STAMP_BYTES = 8


def stamp(owner: str, slot: int, generation: int) -> torch.Tensor:
    value = (OWNERS.index(owner) + 1) * 1_000_003 + slot * 1009 + generation
    return torch.tensor([value], dtype=torch.int64).view(torch.uint8)


class PoolMachine(RuleBasedStateMachine):
    @initialize()
    def open_pool(self) -> None:
        config = make_config(kv_low_watermark_pages=1, kv_high_watermark_pages=3)
        self.pool = XTensor.open("cpu", NUM_POOL_PAGES * TEST_PAGE_BYTES, config)
        self.page = self.pool.page_size_bytes
        self.kv_views: dict[str, torch.Tensor] = {}
        self.held: dict[str, dict[int, int]] = {o: {} for o in OWNERS}  # slot -> stamp generation
        self.weights: dict[str, tuple[torch.Tensor, int]] = {}  # view, stamp generation
        self.asleep: set[str] = set()
        self.generation = 0
        for owner in OWNERS:  # every model starts with its KV view reserved; remove_owner + reserve_kv cycle it
            self.kv_views[owner] = self.pool.reserve_kv(owner, MAX_KV_PAGES, "cpu")

    def teardown(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is None:
            return
        for owner in pool.owners():
            pool.remove_owner(owner)
        counters = pool.counters()
        assert counters.num_pages_free == NUM_POOL_PAGES and counters.pages_by_model == {}
        pool.close()

    # ---- rules ---------------------------------------------------------------------------------------------------
    @rule(owner=st.sampled_from(OWNERS), num_pages=st.integers(1, 20), tail_bytes=st.integers(STAMP_BYTES, 100))
    def allocate_weights(self, owner, num_pages, tail_bytes):
        num_bytes = (num_pages - 1) * self.page + tail_bytes
        if owner in self.asleep or owner in self.weights:
            try:
                self.pool.allocate_weights(owner, num_bytes, "cpu")
            except XTensorError as exc:
                assert not isinstance(exc, PoolExhaustedError)
                return
            raise AssertionError("a second weight load (or one while asleep) must be refused")
        before = self.pool.counters()
        reclaimable = sum(kinds.get(KV_CACHED, 0) for kinds in before.pages_by_model.values())
        try:
            view = self.pool.allocate_weights(owner, num_bytes, "cpu")
        except PoolExhaustedError:
            assert before.num_pages_free + reclaimable < num_pages
            return
        assert view.numel() == num_bytes
        self.generation += 1
        self.weights[owner] = (view, self.generation)
        self._stamp_weights(owner)

    @rule(owner=st.sampled_from(OWNERS))
    def release_weights(self, owner):
        if owner not in self.pool.owners():
            return
        self.pool.release_weights(owner)
        self.weights.pop(owner, None)

    @rule(owner=st.sampled_from(OWNERS))
    def reserve_kv(self, owner):
        view = self.pool.reserve_kv(owner, MAX_KV_PAGES, "cpu")
        if owner in self.kv_views:
            assert view.data_ptr() == self.kv_views[owner].data_ptr()  # same view again
        self.kv_views[owner] = view

    @rule(owner=st.sampled_from(OWNERS), num_pages=st.integers(1, 5))
    def acquire_kv(self, owner, num_pages):
        if owner not in self.kv_views or owner in self.asleep:
            try:
                self.pool.acquire_kv_pages(owner, num_pages)
            except XTensorError:
                return
            raise AssertionError("acquire without a reservation, or while asleep, must be refused")
        before = self.pool.counters()
        slots = self.pool.acquire_kv_pages(owner, num_pages)
        if slots is None:
            after = self.pool.counters()
            assert after.pages_by_model.get(owner, {}).get("kv", 0) == len(self.held[owner])  # nothing taken
            reclaimable = sum(k.get(KV_CACHED, 0) for o, k in before.pages_by_model.items() if o != owner)
            own_cached = before.pages_by_model.get(owner, {}).get(KV_CACHED, 0)
            is_view_full = len(self.held[owner]) + num_pages > MAX_KV_PAGES
            assert is_view_full or own_cached + before.num_pages_free + reclaimable < num_pages
            return
        assert len(slots) == num_pages and len(set(slots)) == num_pages
        assert all(0 <= s < MAX_KV_PAGES and s not in self.held[owner] for s in slots)
        view = self.kv_views[owner]
        for slot in slots:
            self.generation += 1
            view[slot * self.page: slot * self.page + STAMP_BYTES] = stamp(owner, slot, self.generation)
            self.held[owner][slot] = self.generation

    @rule(owner=st.sampled_from(OWNERS), data=st.data())
    def release_kv(self, owner, data):
        if not self.held[owner]:
            return
        slots = data.draw(st.lists(st.sampled_from(sorted(self.held[owner])), min_size=1, unique=True))
        self.pool.release_kv_pages(owner, slots)
        for slot in slots:
            del self.held[owner][slot]

    @rule(owner=st.sampled_from(OWNERS))
    def release_unheld_kv_is_refused(self, owner):
        if owner not in self.kv_views:
            return
        free_slots = [s for s in range(MAX_KV_PAGES) if s not in self.held[owner]]
        if free_slots:
            try:
                self.pool.release_kv_pages(owner, [free_slots[0]])
            except XTensorError:
                return
            raise AssertionError("releasing a page the owner does not hold must be refused")

    @rule()
    def maintenance(self):
        self.pool.run_kv_maintenance()
        counters = self.pool.counters()
        for owner, kinds in counters.pages_by_model.items():
            assert kinds.get(KV_CACHED, 0) <= 3  # the high watermark
            has_unmapped_slots = len(self.held.get(owner, {})) < MAX_KV_PAGES
            if owner in self.kv_views and owner not in self.asleep and counters.num_pages_free and has_unmapped_slots:
                assert kinds.get(KV_CACHED, 0) >= 1  # refilled up to at least the low watermark

    @rule(owner=st.sampled_from(OWNERS), max_moves=st.integers(1, 30))
    def compact(self, owner, max_moves):
        # Pages move under the views with their contents: the invariants below re-read every stamp.
        if owner not in self.pool.owners() or owner in self.asleep:
            return
        before = self.pool.counters()
        num_moved = self.pool.compact(owner, max_moves)
        assert 0 <= num_moved <= max_moves
        after = self.pool.counters()
        assert after.num_pages_free == before.num_pages_free and after.pages_by_model == before.pages_by_model

    @rule(owner=st.sampled_from(OWNERS))
    def sleep(self, owner):
        if owner not in self.pool.owners():
            return
        self.pool.sleep(owner)
        self.asleep.add(owner)
        kinds = self.pool.counters().pages_by_model.get(owner, {})
        assert sum(kinds.values()) == 0  # every page came back
        assert self.pool.weight_segments(owner) == []

    @rule(owner=st.sampled_from(OWNERS))
    def wake(self, owner):
        if owner not in self.asleep:
            return
        try:
            self.pool.wake(owner)
        except PoolExhaustedError:
            assert self.pool.is_asleep(owner)
            return
        self.asleep.discard(owner)
        # Contents did not survive (the lifecycle layer copies weights back in); the same views write again.
        if owner in self.weights:
            self._stamp_weights(owner)
        for slot in self.held[owner]:
            self.kv_views[owner][slot * self.page: slot * self.page + STAMP_BYTES] = stamp(
                owner, slot, self.held[owner][slot])

    @rule(owner=st.sampled_from(OWNERS))
    def sleep_and_wake(self, owner):
        # The pair as one step too, so that short runs reach wake with KV pages held and weights loaded.
        self.sleep(owner)
        self.wake(owner)

    @precondition(lambda self: any(o in self.pool.owners() for o in OWNERS))
    @rule(owner=st.sampled_from(OWNERS))
    def remove_owner(self, owner):
        if owner not in self.pool.owners():
            return
        self.pool.remove_owner(owner)
        self.kv_views.pop(owner, None)
        self.weights.pop(owner, None)
        self.held[owner] = {}
        self.asleep.discard(owner)

    def _stamp_weights(self, owner: str) -> None:
        view, generation = self.weights[owner]
        for view_page in range(-(-view.numel() // self.page)):
            start = view_page * self.page
            view[start: start + STAMP_BYTES] = stamp(owner, 100 + view_page, generation)

    # ---- invariants ----------------------------------------------------------------------------------------------
    @invariant()
    def pages_are_owned_once_and_data_round_trips(self):
        pool = self.pool
        table = pool.page_table_snapshot()
        weight_pages: dict[int, str] = {}
        for owner in pool.owners():
            segments = pool.weight_segments(owner)
            if owner in self.weights and owner not in self.asleep:
                view, generation = self.weights[owner]
                assert sum(size for _, size in segments) == view.numel()
                view_page = 0  # segments come in view order: page k of the view is the k-th page they cover
                for offset, size in segments:
                    assert offset % self.page == 0
                    for page_id in range(offset // self.page, -(-(offset + size) // self.page)):
                        assert page_id not in weight_pages, "a page in two weight segments"
                        weight_pages[page_id] = owner
                        assert table[page_id] == (owner, "weights")
                        assert torch.equal(pool.global_view(page_id * self.page, STAMP_BYTES),
                                           stamp(owner, 100 + view_page, generation))
                        view_page += 1
            else:
                assert segments == []
        kv_pages: dict[int, str] = {}
        for owner, held in self.held.items():
            if owner in self.asleep:
                continue
            for slot, generation in held.items():
                offset = pool.kv_page_global_offset(owner, slot)
                page_id = offset // self.page
                assert page_id not in kv_pages and page_id not in weight_pages, "KV page owned twice"
                kv_pages[page_id] = owner
                assert table[page_id] == (owner, "kv")
                assert torch.equal(pool.global_view(offset, STAMP_BYTES), stamp(owner, slot, generation))

    @invariant()
    def counters_add_up(self):
        counters = self.pool.counters()
        owned = sum(sum(kinds.values()) for kinds in counters.pages_by_model.values())
        assert counters.num_pages_free + owned == counters.num_pages_total == NUM_POOL_PAGES
        table = self.pool.page_table_snapshot()
        assert sum(entry is None for entry in table) == counters.num_pages_free
        for owner, held in self.held.items():
            kinds = counters.pages_by_model.get(owner, {})
            if owner not in self.asleep:
                assert kinds.get("kv", 0) == len(held)
            if owner in self.weights and owner not in self.asleep:
                assert kinds["weights"] == -(-self.weights[owner][0].numel() // self.page)
        free = [page_id for page_id, entry in enumerate(table) if entry is None]
        largest = max((n for _, n in self.pool.free_runs()), default=0)
        assert counters.fragmentation == (0.0 if not free else 1 - largest / len(free))


PoolMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestPoolProperties = PoolMachine.TestCase
