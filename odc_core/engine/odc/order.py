"""The order the units' forwards run in, learned as they run: which unit a prefetch gathers.

wrap() takes units in any order (docs/use_odc.md), and a model's modules need not be listed, or
registered, in the order its forward calls them. Prefetching the unit listed next then gathered
one the forward had already used, or would use much later, while the unit it needed next was
gathered on demand. So each training forward pass records, by the modules' places in wrap()'s
list, which module's forward began after which; once a pass has run, a forward's prefetch
follows the last pass's record and a backward's the record reversed. Before that, the listed
order stands in.

A pass ends where its backward begins. A module that runs again in the same pass (a second
forward before one backward, a layer applied twice) records nothing more: its first run's
neighbours stand. Forwards without gradients (evaluation, generation) and recomputations
inside a backward follow the record and leave it as it is: one generation step after another
would record the head followed by the embeddings. A module the last pass did not run (a branch
some inputs take) has no known successor: nothing is prefetched after it, and it stays
gathered from its forward to its backward, as the pass's last unit does.
"""

from __future__ import annotations


class ExecutionOrder:
    """The forward order of `modules` module places (UnitHooks' positions)."""

    def __init__(self, modules: int) -> None:
        self._modules = modules
        # The last finished pass's neighbours; None before any, where the listed order stands in.
        self._after: dict[int, int] | None = None
        self._before: dict[int, int] | None = None
        self._pass_after: dict[int, int] = {}  # this pass's, so far
        self._pass_before: dict[int, int] = {}
        self._ran: set[int] = set()  # the places whose forward began in this pass
        self._last: int | None = None  # the one that began last, on its first run

    def began(self, pos: int) -> None:
        """The forward of the module at `pos` began in a training pass (not a recomputation)."""
        if pos in self._ran:
            return  # it keeps its first run's neighbours
        if self._last is not None:
            self._pass_after.setdefault(self._last, pos)
            self._pass_before[pos] = self._last
        self._ran.add(pos)
        self._last = pos

    def pass_over(self) -> None:
        """This pass's backward began: its record is the one prefetches follow from now on."""
        if self._ran:
            self._after, self._before = self._pass_after, self._pass_before
        self._pass_after, self._pass_before, self._ran, self._last = {}, {}, set(), None

    def after(self, pos: int) -> int | None:
        """The place whose forward follows `pos`'s (None: none, or not known)."""
        if self._after is None:
            return pos + 1 if pos + 1 < self._modules else None
        return self._after.get(pos)

    def before(self, pos: int) -> int | None:
        """The place whose forward preceded `pos`'s: the backward that follows its own."""
        if self._before is None:
            return pos - 1 if pos >= 1 else None
        return self._before.get(pos)
