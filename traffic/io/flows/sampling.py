"""Sampling rates of v9/IPFIX records: what their own fields say, and which source of a rate comes first (§7a).

NetFlow v5 and sFlow say their rate per datagram or sample (``netflow5``, ``sflow``); options data teach
an exporter's rates (``templates``); ``data_sets`` applies them to the records.
"""

from __future__ import annotations

import numpy as np

from traffic.io.flows.records import P_RATE_RANGE, P_RATE_UNUSABLE

#: The largest rate kept or applied: ingest stores rates as 32-bit integers.
MAX_RATE = (1 << 31) - 1
#: Sampler and selector ids remembered per (exporter, format, domain), the least recently said dropped first.
MAX_SAMPLERS = 1024


def usable_rate(rate: int) -> bool:
    """A rate that can be kept or applied: 1 in 1 up to 1 in ``MAX_RATE``."""
    return 1 <= rate <= MAX_RATE


def rate_said(value: dict, n: int, lengths: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rate, problem) of each record from its own sampling fields: the rate is 1 in N, 0 where they say nothing.

    The first of these that says something is used: the PSAMP fields the selectorAlgorithm (304) names, or,
    without 304, whichever are present in this order: samplingSize/Population (309/310, n out of N:
    N / n), samplingPacketInterval/Space (305/306, count-based: (interval + space) / interval),
    samplingProbability (311, a float: 1 / p); then samplingInterval (34, with or without the algorithm 35)
    and samplerRandomInterval (50). A rate is rounded to a whole number. ``problem`` is ``P_RATE_RANGE``
    for a rate above ``MAX_RATE`` and ``P_RATE_UNUSABLE`` for fields that give a rate and no usable one;
    the rate is then 0. 34 or 50 of 0, and 305/306 or 309/310 both 0, say nothing.
    """
    lengths = lengths or {}
    algorithm = value.get(304)

    def named(*algorithms: int) -> np.ndarray:
        return np.ones(n, bool) if algorithm is None else np.isin(algorithm, np.array(algorithms, np.uint64))

    candidates = []  # (says something, rate as float, unusable)
    if 309 in value and 310 in value:
        size, population = value[309].astype(np.float64), value[310].astype(np.float64)
        candidates.append((named(3) & ((size > 0) | (population > 0)),
                           population / np.where(size > 0, size, 1), (size == 0) | (population < size)))
    if 305 in value and 306 in value:
        interval, space = value[305].astype(np.float64), value[306].astype(np.float64)
        candidates.append((named(1) & ((interval > 0) | (space > 0)),
                           (interval + space) / np.where(interval > 0, interval, 1), interval == 0))
    if 311 in value:
        bits = value[311]
        p = (bits.astype(np.uint32).view(np.float32).astype(np.float64) if lengths.get(311) == 4
             else bits.view(np.float64))
        usable = (p > 0) & (p <= 1)  # NaN is neither
        candidates.append((named(4), 1 / np.where(usable, p, 1), ~usable))
    for ie in (34, 50):
        if ie in value:
            said = value[ie].astype(np.float64)
            candidates.append((said > 0, said, np.zeros(n, bool)))
    rate = np.zeros(n, np.float64)
    unusable, chosen = np.zeros(n, bool), np.zeros(n, bool)
    for says, ratio, bad in candidates:
        take = says & ~chosen
        rate[take], unusable[take] = ratio[take], bad[take]
        chosen |= take
    rate = np.rint(rate)
    problem = np.where(unusable, P_RATE_UNUSABLE, np.where(rate > MAX_RATE, P_RATE_RANGE, 0)).astype(np.int8)
    return np.where(chosen & (problem == 0), rate, 0).astype(np.int64), problem


def rate_by_precedence(own: np.ndarray, sampler: np.ndarray, last_options: np.ndarray) -> np.ndarray:
    """The rate a v9/IPFIX record is sampled at, from what says it, first first (§7a): the record's own
    sampling fields, else the rate of the sampler or selector it names, else the last rate its exporter's
    options data said for the domain; 0 if none (ingest: the source's setting, else 1). The per-source
    setting, which comes before all of these, is ingest's; NetFlow v5 and sFlow say theirs per datagram
    or sample."""
    return np.where(own > 0, own, np.where(sampler > 0, sampler, last_options))


def samplers_rate(ids: np.ndarray, set_index: np.ndarray, samplers: list) -> np.ndarray:
    """The rate of the sampler or selector each record names, from the map its set was queued with (0: not
    known). One look-up per distinct (set, id)."""
    pairs = np.stack([set_index.astype(np.uint64), ids.astype(np.uint64)], axis=1)
    distinct, inverse = np.unique(pairs, axis=0, return_inverse=True)
    rates = np.array([(samplers[s] or {}).get(i, 0) for s, i in distinct.tolist()], np.int64)
    return rates[inverse.reshape(-1)]
