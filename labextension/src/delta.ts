import { IDeltaMessage, IGroup, IProcess, IState } from './protocol';

/**
 * The state after a `delta` message, or null when the delta applies to another version
 * than the one held (the caller then asks for the whole state).
 *
 * @param held - The state held, and the version of its rows.
 * @param version - That version.
 * @param delta - The message.
 */
export function applyDelta(
  held: IState | null,
  version: number,
  delta: IDeltaMessage
): IState | null {
  if (!held || delta.rows.base !== version) {
    return null;
  }
  const next: IState = { ...delta.state };
  if (!next.cluster) {
    return next;
  }
  const before = held.cluster;
  const byRank = new Map<number, IProcess>();
  for (const p of before?.processes ?? []) {
    byRank.set(p.rank, p);
  }
  for (const rank of delta.rows.gone) {
    byRank.delete(rank);
  }
  for (const [key, row] of Object.entries(delta.rows.rows)) {
    const rank = Number(key);
    byRank.set(rank, { ...(byRank.get(rank) ?? {}), ...row } as IProcess);
  }
  for (const [key, age] of Object.entries(delta.rows.ages)) {
    const p = byRank.get(Number(key));
    if (p) {
      byRank.set(p.rank, { ...p, heartbeat_age: age });
    }
  }
  next.cluster = {
    ...next.cluster,
    processes: [...byRank.values()].sort((a, b) => a.rank - b.rank),
    summary: 'summary' in delta ? delta.summary : (before?.summary ?? null)
  };
  return next;
}

/** A group's counts in words, the most alarming state last: `31 alive, 1 dead`. */
export function groupCounts(group: IGroup): string {
  const order = ['alive', 'starting', 'restarting', 'unknown', 'stuck', 'dead'];
  const rank = (s: string) => (order.includes(s) ? order.indexOf(s) : 3);
  return Object.entries(group.states)
    .sort(([a], [b]) => rank(a) - rank(b))
    .map(([state, n]) => `${n} ${state}`)
    .join(', ');
}

/** Counts by state in words: `1020 alive · 4 dead`. */
export function stateCounts(byState: Record<string, number>): string {
  return Object.entries(byState)
    .map(([state, n]) => `${n} ${state}`)
    .join(' · ');
}
