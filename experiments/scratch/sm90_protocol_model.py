"""Protocol model of the persistent attention_fwd_sm90_ws<PERSIST> (scratch, #9; written by review helpers,
2026-12-01), with release_o() at OREL_LATE 0 / 1 / 2, general STAGES, per-arrival phase checks on the empty barriers, and planted bugs.
Warpgroup granularity; async events (Q/K/V TMA landing, O store read by the copy engine) interleave at random."""
import random, sys

class Err(Exception): pass

class MBar:
    def __init__(s, count, name): s.count, s.pending, s.tx, s.phase, s.name = count, count, 0, 0, name
    def _chk(s):
        if s.pending < 0: raise Err(f"{s.name}: too many arrivals in phase {s.phase}")
        if s.pending == 0 and s.tx == 0: s.phase += 1; s.pending = s.count
    def arrive(s, n=1): s.pending -= n; s._chk()
    def arrive_tx(s, b): s.tx += b; s.pending -= 1; s._chk()
    def complete_tx(s, b): s.tx -= b; s._chk()
    def done(s, parity): return (s.phase & 1) != parity

class NBar:
    def __init__(s, name): s.name, s.count, s.syncers, s.gen = name, 0, 0, 0
    def add(s, n, total, sync):
        s.count += n; s.syncers += sync
        if s.count > total: raise Err(f"{s.name} overfull")
        if s.count == total:
            if s.syncers == 0: raise Err(f"{s.name}: generation {s.gen} completed by arrivals alone")
            s.count = 0; s.syncers = 0; s.gen += 1; return True
        return False

def run(tiles, NWG, OREL, STAGES=3, QSPLIT=1, seed=0, bug=None):
    rnd = random.Random(seed)
    PING = NWG == 2; OSTAGE = PING or NWG == 1; XTURN = True
    QPARTS = NWG if QSPLIT else 1; QPW = NWG // QPARTS
    full = [MBar(1, f"full{s}") for s in range(STAGES)]
    empty = [MBar(NWG * 4, f"empty{s}") for s in range(STAGES)]
    qfull = [MBar(1, f"qfull{p}") for p in range(QPARTS)]
    qempty = [MBar(QPW * 4, f"qempty{p}") for p in range(QPARTS)]
    nb = {}
    def N(i):
        if i not in nb: nb[i] = NBar(f"bar{i}")
        return nb[i]
    BAR_Q, BAR_SCHED, BAR_KFREE = 1, 1 + NWG, 1 + 2 * NWG
    n_work = len(tiles)
    slot = [None] * QPARTS
    qdata = [None] * NWG; q_in_use = [False] * NWG; slot_read = [-1] * NWG
    kdata = [None] * STAGES; vdata = [None] * STAGES
    kreaders = [set() for _ in range(STAGES)]; vreaders = [set() for _ in range(STAGES)]
    o_pending = [0] * STAGES
    events = []
    bulk_read_pending = [0] * NWG
    released = [[0] * NWG for _ in range(sum(t[0] for t in tiles))]  # (K/V tile, consumer): arrivals (x4)
    stats = {"orel_at": {}}

    def empty_arrive(c, gi):  # consumer c's 4 warps give back K/V tile gi's stage
        st = gi % STAGES
        if empty[st].phase != gi // STAGES:
            raise Err(f"consumer {c} releases tile {gi} into empty{st} phase {empty[st].phase} (expected {gi // STAGES})")
        released[gi][c] += 1
        if released[gi][c] > 1: raise Err(f"tile {gi} released twice by consumer {c}")
        empty[st].arrive(4)

    def nsync(i, total):
        b = N(i); g0 = b.gen
        b.add(128, total, 1)
        while b.gen == g0: yield lambda: b.gen != g0
    def narrive(i, total): N(i).add(128, total, 0)

    def producer():
        g = 0; u = 0
        for w in range(10 ** 9):
            def publish(p):
                if w > 0:
                    yield lambda: qempty[p].done((w - 1) & 1)
                for c in range(p * QPW, (p + 1) * QPW):
                    if slot_read[c] != w - 1: raise Err(f"slot {p} overwritten before consumer {c} read tile {w-1}'s u")
                slot[p] = u
            if u >= n_work:
                for p in range(QPARTS):
                    yield from publish(p)
                    qfull[p].arrive()
                return
            n = tiles[u][0]
            for p in range(QPARTS):
                yield from publish(p)
                qfull[p].arrive_tx(QPW)
                for r in range(p * QPW, (p + 1) * QPW):
                    if q_in_use[r]: raise Err(f"Q rows of consumer {r} reloaded while in use (tile {w})")
                    events.append(("q", r, w, p))
                yield lambda: True
            for it in range(n):
                st = g % STAGES
                if g >= STAGES:
                    yield lambda: empty[st].done(((g // STAGES) - 1) & 1)
                if kreaders[st] or vreaders[st]: raise Err(f"stage {st} refilled while read")
                if o_pending[st]: raise Err(f"stage {st} (tile {g}) refilled while the O store still reads it")
                full[st].arrive_tx(2)
                kdata[st] = vdata[st] = None  # being overwritten
                events.append(("k", st, g)); events.append(("v", st, g))
                g += 1
                yield lambda: True
            u += 1

    def consumer(c):
        qp = c // QPW
        g = 0; turns_started = False; kfree = BAR_KFREE
        st_ = {"o_stage": -1, "o_tile": -1}
        def release_o(where):
            if OSTAGE and st_["o_stage"] >= 0:
                if bug != "nowait":
                    yield lambda: bulk_read_pending[c] == 0  # thread 0: cp.async.bulk.wait_group.read 0
                stats["orel_at"][where] = stats["orel_at"].get(where, 0) + 1
                empty_arrive(c, st_["o_tile"])
                if bug != "noreset": st_["o_stage"] = -1
        for w in range(10 ** 9):
            yield lambda: qfull[qp].done(w & 1)
            u = slot[qp]
            if u != (w if w < n_work else u) or (w >= n_work and u < n_work): raise Err(f"consumer {c} read u={u} at w={w}")
            slot_read[c] = w
            if not OREL: yield from release_o("top")
            if u >= n_work:
                if bug != "noend": yield from release_o("end")
                if PING and c == 0 and turns_started: yield from nsync(BAR_SCHED + 0, 256)
                break
            q_in_use[c] = True
            n_all, own = tiles[u]
            n_tiles = n_all  # OSTAGE kernels: ping-pong or one consumer
            def release_q():
                q_in_use[c] = False; qempty[qp].arrive(4)
            def last_s_done():
                release_q()
                if OSTAGE and NWG > 1: narrive(kfree + (c ^ 1), 256)
            def turn_wait():
                if PING: yield from nsync(BAR_SCHED + c, 256)
            def turn_pass(last):
                if PING and (XTURN or not (last and c == 1)): narrive(BAR_SCHED + (c ^ 1), 256)
            def readq():
                if qdata[c] != w: raise Err(f"consumer {c} reads Q of tile {qdata[c]} at w={w}")
            if n_tiles > 0:
                if PING and c == 1 and not (XTURN and turns_started): narrive(BAR_SCHED + 0, 256)
                turns_started = True
                st0 = g % STAGES
                yield lambda: full[st0].done((g // STAGES) & 1)
                yield from turn_wait()
                readq()
                if kdata[st0] != g: raise Err("K stale")
                kreaders[st0].add(c)
                turn_pass(False)
                if OREL == 1 and bug != "nos0": yield from release_o("S0")
                yield lambda: True  # wgmma_wait<0>
                readq(); kreaders[st0].discard(c)
                if n_tiles == 1: last_s_done()
                for it in range(1, n_tiles):
                    gi = g + it; st = gi % STAGES; pst = (gi - 1) % STAGES
                    yield lambda: full[st].done((gi // STAGES) & 1)
                    yield from turn_wait()
                    readq()
                    if kdata[st] != gi or vdata[pst] != gi - 1: raise Err("K/V stale")
                    kreaders[st].add(c); vreaders[pst].add(c)
                    turn_pass(False)
                    if OREL == 2 and it == 1 and bug != "noit1": yield from release_o("it1")
                    yield lambda: True  # wgmma_wait<1>
                    readq(); kreaders[st].discard(c)
                    if it == n_tiles - 1: last_s_done()
                    yield lambda: True  # wgmma_wait<0>
                    if vdata[pst] != gi - 1: raise Err("V overwritten during PV")
                    vreaders[pst].discard(c)
                    empty_arrive(c, gi - 1)
                lst = (g + n_tiles - 1) % STAGES
                yield from turn_wait()
                if vdata[lst] != g + n_tiles - 1: raise Err("V stale (last)")
                vreaders[lst].add(c)
                turn_pass(True)
                if OREL == 2 and bug != "nolastpv": yield from release_o("lastPV")
                yield lambda: True
                vreaders[lst].discard(c)
                if not OSTAGE: empty_arrive(c, g + n_tiles - 1)
            if bug != "nocatch": yield from release_o("catch")
            if n_tiles == 0: release_q()
            if OSTAGE and n_tiles > 0:
                lst = (g + n_tiles - 1) % STAGES
                if NWG > 1: yield from nsync(kfree + c, 256)
                if kreaders[lst]: raise Err(f"O staged into K stage {lst} while consumer(s) {kreaders[lst]} read it")
                if kdata[lst] != g + n_tiles - 1: raise Err("O stage reused")
                yield from nsync(BAR_Q + c, 128)
                o_pending[lst] += 1; bulk_read_pending[c] += 1
                events.append(("o", lst, c))
                st_["o_stage"] = lst; st_["o_tile"] = g + n_tiles - 1
                kfree = BAR_KFREE + 2 if kfree == BAR_KFREE else BAR_KFREE
            g += n_all
        yield lambda: bulk_read_pending[c] == 0  # bulk_wait_all

    threads = [producer()] + [consumer(c) for c in range(NWG)]
    conds = [lambda: True] * len(threads)
    alive = [True] * len(threads)
    steps = 0
    while any(alive) or events:
        ready = [i for i in range(len(threads)) if alive[i] and conds[i]()]
        choices = [("t", i) for i in ready] + [("e", j) for j in range(len(events))]
        if not choices:
            raise Err("DEADLOCK: " + ", ".join(f"t{i}" for i in range(len(threads)) if alive[i]))
        kind, i = rnd.choice(choices)
        if kind == "e":
            ev = events.pop(i)
            if ev[0] == "q": qdata[ev[1]] = ev[2]; qfull[ev[3]].complete_tx(1)
            elif ev[0] == "k": kdata[ev[1]] = ev[2]; full[ev[1]].complete_tx(1)
            elif ev[0] == "v": vdata[ev[1]] = ev[2]; full[ev[1]].complete_tx(1)
            elif ev[0] == "o": o_pending[ev[1]] -= 1; bulk_read_pending[ev[2]] -= 1
            continue
        try:
            conds[i] = next(threads[i])
        except StopIteration:
            alive[i] = False
        steps += 1
    # every K/V tile given back by every consumer, except (harmlessly) the last O stage if its release was skipped
    return steps, stats

def rand_tiles(rnd, k):
    return [(rnd.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 7]), None) for _ in range(k)]

def sweep(n_runs, OREL, STAGES, bug=None, NWGS=(1, 2), QS=(1, 0), seed0=1, quiet=False):
    rnd = random.Random(seed0 * 1000 + OREL * 10 + STAGES)
    bad = 0; first = None; steps = 0; where = {}
    for NWG in NWGS:
        for QSPLIT in QS:
            if NWG == 1 and QSPLIT == 0: continue
            for r in range(n_runs):
                tiles = rand_tiles(rnd, rnd.randint(1, 10))
                try:
                    s, st = run(tiles, NWG, OREL, STAGES, QSPLIT, seed=r, bug=bug); steps += s
                    for k, v in st["orel_at"].items(): where[k] = where.get(k, 0) + v
                except Err as e:
                    bad += 1
                    if first is None: first = (NWG, QSPLIT, [t[0] for t in tiles], str(e))
    return bad, first, steps, where

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print("== correct code ==")
    for STAGES in (3, 4, 2):
        for OREL in (0, 1, 2):
            bad, first, steps, where = sweep(n, OREL, STAGES)
            print(f"STAGES {STAGES} OREL {OREL}: runs {3*n} errors {bad} steps {steps} releases {where}" + (f" first {first}" if first else ""))
    print("== planted bugs (STAGES 3) ==")
    for bug, OREL in (("nowait", 1), ("nocatch", 1), ("nocatch", 2), ("nocatch", 0), ("noend", 1), ("noend", 2),
                     ("nos0", 1), ("noit1", 2), ("nolastpv", 2), ("noreset", 1), ("noreset", 2)):
        bad, first, steps, where = sweep(max(200, n // 4), OREL, 3, bug=bug)
        print(f"bug {bug} OREL {OREL}: errors {bad}" + (f" first {first}" if first else ""))
    for OREL in (3,):  # a knob value the kernel accepts silently: release only at the catch-all
        bad, first, steps, where = sweep(max(200, n // 4), OREL, 3)
        print(f"OREL {OREL} (unvalidated value): errors {bad}" + (f" first {first}" if first else ""))
