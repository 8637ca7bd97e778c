#!lua name=pivirt_sched
--[[
  The scheduler's side of the registry: reservations of node resources, and the replies to plan
  requests. Loaded by every pivirt process on (re)connect, like the other libraries.

  Resource arithmetic (how much a core, a volume or a byte of memory holds) is done in C by the
  scheduler (shared/core/pv_res): these functions only make its results atomic. A writer reads a
  node's `usage` and `usage_rev`, computes the new usage, and commits it here; the commit checks
  that every node it touches still has the revision the writer read (compare-and-set), so two
  schedulers planning from the same picture can never both take the last slot of a node: the
  second one's commit fails with a conflict and it plans again from fresh data.

  Keys (shared/store/pv_resv.h has the whole schema): ARGV[1] is the key base "<prefix>{reg}:";
  KEYS[1] is the reservation's own key; records reached through it (node:<id>, node-allocs:<id>,
  deploy-count:<app>:<entry>, the plan reply and abandon keys) are derived from ARGV.
]]

-- Checks that each node still exists and has the expected usage revision. The node list starts
-- at args[i]: n, then for each node: id, name, expected_rev, new_usage, count, then count pairs
-- (alloc id, alloc json or '') . Returns nil or the name of the first node that moved.
-- Also returns each node's revisions as read (node_revs), by id, for apply_nodes, and the index
-- of the first argument after the list.
local function nodes_moved(base, args, i)
  local n = tonumber(args[i]); i = i + 1
  local read = {}
  for _ = 1, n do
    local id, name, rev, count = args[i], args[i + 1], args[i + 2], tonumber(args[i + 4])
    local revs = node_revs(base .. 'node:' .. id)
    if not revs or revs.usage_rev ~= rev then return name end
    read[id] = revs
    i = i + 5 + 2 * count
  end
  return nil, read, i
end

-- Adds delta[name] to each name's deploy count in the hash counts (names: the list of them); a
-- count that reaches 0 goes. One node: one HINCRBY; more: one HMGET and one HSET (and HDEL)
-- for them all, instead of one HINCRBY each.
local function add_counts(counts, names, delta)
  if #names == 1 then
    local left = redis.call('HINCRBY', counts, names[1], delta[names[1]])
    if left <= 0 then redis.call('HDEL', counts, names[1]) end
    return
  end
  for from = 1, #names, SPREAD do
    local part = {}
    for k = from, math.min(#names, from + SPREAD - 1) do part[#part + 1] = names[k] end
    local cur = redis.call('HMGET', counts, unpack(part))
    local set, gone = {}, {}
    for k, name in ipairs(part) do
      local left = (tonumber(cur[k]) or 0) + delta[name]
      if left > 0 then
        set[#set + 1] = name
        set[#set + 1] = left
      else
        gone[#gone + 1] = name
      end
    end
    if #set > 0 then redis.call('HSET', counts, unpack(set)) end
    if #gone > 0 then redis.call('HDEL', counts, unpack(gone)) end
  end
end

-- Writes each node's new usage, bumps its revisions (read by nodes_moved: revs), and adds
-- (sign 1) or removes (sign -1) its allocations and deploy counts. now: Redis's clock, as text.
-- seqs (a table, or nil): gets each node's record rev before its write (every write of a record
-- bumps it) and its seq in the change index after it, so the scheduler that wrote it knows
-- whether its cached record was the latest and can skip reading it back (sched_cache.h).
-- The change index and the deploy counts take all the nodes in a few commands (nodes_changed,
-- add_counts): a 50-node plan's commit is some 150 commands, not 300.
local function apply_nodes(base, args, i, sign, app, entry, revs, now, seqs)
  local n = tonumber(args[i]); i = i + 1
  if n == 0 then return end
  local ids, names, delta = {}, {}, {}
  local at = i
  for _ = 1, n do
    ids[#ids + 1] = args[at]
    at = at + 5 + 2 * tonumber(args[at + 4])
  end
  local first = nodes_changed(base, ids)
  for k = 1, n do
    local id, name, usage, count = args[i], args[i + 1], args[i + 3], tonumber(args[i + 4])
    if seqs then seqs[#seqs + 1] = revs[id].rev end
    node_write_usage(base .. 'node:' .. id, revs[id], usage, now)
    if seqs then seqs[#seqs + 1] = tostring(first + k - 1) end
    local allocs = base .. 'node-allocs:' .. id
    local changed = 0
    for j = 1, count do
      local aid, body = args[i + 5 + 2 * (j - 1)], args[i + 6 + 2 * (j - 1)]
      if sign > 0 then
        redis.call('HSET', allocs, aid, body)
        changed = changed + 1
      else
        -- An allocation a workload took over (pv_workload_add) is no longer here: its instance
        -- still counts, so only the allocations actually given back leave the deploy count.
        changed = changed + redis.call('HDEL', allocs, aid)
      end
    end
    if changed > 0 then
      if not delta[name] then names[#names + 1] = name end
      delta[name] = (delta[name] or 0) + sign * changed
    end
    i = i + 5 + 2 * count
  end
  if app ~= '' and #names > 0 then
    add_counts(base .. 'deploy-count:' .. app .. ':' .. entry, names, delta)
  end
end

-- Writes a plan's reply for its requester's BLPOP. A reply is a message to a connection that is
-- waiting now, not state: it is neither appended to the AOF nor sent to replicas (REPL_NONE).
-- After a restart or a failover every waiting connection is gone with it, so a reply kept there
-- would never be read; a requester that lost its connection asks again with the same request id,
-- and a reservation made before the crash (which is kept: the commit's writes are) answers it as
-- DUPLICATE. Kept, a 10,000-node capacity answer put some 200 KB in the AOF per call, fsync'd,
-- and made the AOF rewrite itself every few dozen calls. Its BLPOP reaches the AOF as an LPOP of
-- a list that is not there on a reload: a no-op.
local function push_reply(key, body, ttl)
  redis.set_repl(redis.REPL_NONE)
  redis.call('LPUSH', key, body)
  redis.call('EXPIRE', key, ttl)
  redis.set_repl(redis.REPL_ALL)
end

-- pv_sched_commit(KEYS[1]=reservation key, ARGV: base resv_id pod owner app entry expires_ms
-- nodes_json request_id reply_body reply_ttl, then the node list[, 'seqs']) -> 'OK' (with 'seqs'
-- after the list: {'OK', now, then per node its record rev before the write and its seq in the
-- change index after it}) | 'DUPLICATE' | 'ABANDONED' | {'CONFLICT', node name}. The seqs are
-- asked for, not always sent, so that a scheduler of the previous version, which reads 'OK', and
-- this library work together during an upgrade (and this version with the previous library,
-- which ignores the extra argument: the scheduler then reads its nodes back as before).
-- After 'seqs', 'ack' stream group entry: the plan request's stream entry, acknowledged with a
-- commit (not with another outcome: the scheduler plans again or acknowledges it itself), so
-- the request's end is one call, not a commit and an XACK. A library without this ignores it
-- and the request stays pending: another scheduler takes it over later and finds DUPLICATE.
-- request_id '' = no plan reply to write. A reservation whose requester gave up (it marked the
-- request abandoned after its deadline) is not committed: nobody would ever use or release it.
-- A reservation made once is marked for 10 minutes, far past any request's deadline (after which
-- schedulers drop it unanswered): a scheduler that dies after committing and replying but before
-- acknowledging the request leaves it to another, which runs it again, possibly after the deploy
-- already took the allocations and released the reservation. Without the mark that second run
-- would reserve them again, counted twice until the reservation expired.
redis.register_function('pv_sched_commit', function(keys, args)
  local base, resv_id, request_id = args[1], args[2], args[9]
  local made = base .. 'resv-made:' .. resv_id
  -- one EXISTS of the three keys: the usual answer is none of them (then no more reads)
  local gone = request_id ~= '' and base .. 'sched:gone:' .. request_id
  local seen = gone and redis.call('EXISTS', keys[1], made, gone) or
    redis.call('EXISTS', keys[1], made)
  if seen > 0 then
    if not gone or redis.call('EXISTS', keys[1], made) > 0 then return 'DUPLICATE' end
    return 'ABANDONED'
  end
  local moved, revs, after = nodes_moved(base, args, 12)
  if moved then return {'CONFLICT', moved} end
  local app, entry, expires = args[5], args[6], tonumber(args[7])
  local now = tostring(now_ms())
  local seqs = args[after] == 'seqs' and {'OK', now} or nil
  apply_nodes(base, args, 12, 1, app, entry, revs, now, seqs)
  redis.call('HSET', keys[1], 'id', resv_id, 'pod', args[3], 'owner', args[4], 'app', app,
    'entry', entry, 'expires_ms', args[7], 'nodes', args[8], 'created_ms', now)
  if expires > 0 then redis.call('ZADD', base .. 'resvs', expires, resv_id) end
  redis.call('SET', made, '1', 'EX', 600)
  if request_id ~= '' then
    push_reply(base .. 'sched:reply:' .. request_id, args[10], tonumber(args[11]))
  end
  local ack = seqs and after + 1 or after
  if args[ack] == 'ack' then redis.call('XACK', args[ack + 1], args[ack + 2], args[ack + 3]) end
  return seqs or 'OK'
end)

-- pv_sched_release(KEYS[1]=reservation key, ARGV: base resv_id app entry, then the node list
-- with the allocations to drop) -> 'OK' | 'NOT_FOUND' | {'CONFLICT', node name}.
redis.register_function('pv_sched_release', function(keys, args)
  local base, resv_id = args[1], args[2]
  local moved, revs = nodes_moved(base, args, 5)
  -- the DEL tells whether it was there (NOT_FOUND first, as ever: nothing was written yet)
  if moved then
    if redis.call('EXISTS', keys[1]) == 0 then return 'NOT_FOUND' end
    return {'CONFLICT', moved}
  end
  if redis.call('DEL', keys[1]) == 0 then return 'NOT_FOUND' end
  -- Redis's clock only when a node's usage is written
  apply_nodes(base, args, 5, -1, args[3], args[4], revs, tonumber(args[5]) > 0 and
    tostring(now_ms()) or nil)
  redis.call('ZREM', base .. 'resvs', resv_id)
  return 'OK'
end)

-- pv_sched_set_usage(KEYS[1]=node key, ARGV: expected_rev usage) -> 1, or 0 when the revision
-- moved. GetNodeResource's fix rewrites a node's usage from its allocations with it.
redis.register_function('pv_sched_set_usage', function(keys, args)
  if redis.call('EXISTS', keys[1]) == 0 then
    return err('NOT_FOUND', 'node record ' .. keys[1] .. ' is gone')
  end
  if (redis.call('HGET', keys[1], 'usage_rev') or '0') ~= args[1] then return 0 end
  redis.call('HSET', keys[1], 'usage', args[2], 'updated_ms', tostring(now_ms()))
  redis.call('HINCRBY', keys[1], 'usage_rev', 1)
  redis.call('HINCRBY', keys[1], 'rev', 1)
  node_changed(keys[1]:match('^(.*)node:([^:]*)$'))
  return 1
end)

-- pv_sched_reply(KEYS[1]=reply list, KEYS[2]=abandon key, ARGV: body ttl) -> 1, or 0 when the
-- requester has given up already.
redis.register_function('pv_sched_reply', function(keys, args)
  if redis.call('EXISTS', keys[2]) == 1 then return 0 end
  push_reply(keys[1], args[1], tonumber(args[2]))
  return 1
end)

-- pv_sched_abandon(KEYS[1]=reply list, KEYS[2]=abandon key, ARGV: ttl) -> the reply when it
-- arrived after all, else nil with the request marked abandoned (pv_sched_commit then refuses
-- it). One atomic step, so a reservation is either seen by its requester or never made.
redis.register_function('pv_sched_abandon', function(keys, args)
  local body = redis.call('RPOP', keys[1])
  if body then return body end
  redis.call('SET', keys[2], '1', 'EX', tonumber(args[1]))
  return false
end)

--[[ the schedulers' view of the nodes -------------------------------------------------------

  A scheduler keeps the node records it parsed and reads again only those that changed. Two
  sorted sets and a hash (the whole schema: shared/store/pv_sched.h) tell it what changed:
    node-index   hash: seq (the registry-wide change counter), removed (seq of the last node
                 removal), epoch (set when the index was built: a new epoch = a new index)
    node-revs    zset: node id -> seq of its last change (node_changed, shared prelude)
    node-alive   zset: node id -> when its alive key expires (ms, Redis's clock), 0 = not alive
]]

-- pv_sched_changes(KEYS[1]=pods index, ARGV: base since epoch pod [known]) -> {epoch, seq,
-- full, {id, seq, ...}, {dead id, ...}}: the nodes changed after `since` (every node when full
-- is 1: another epoch, an index that went back, or a node removed since), and the nodes not
-- alive now. epoch '' = there is no index yet (pv_sched_index builds it). NOT_FOUND when pod
-- (not '') does not exist; known '1' = the caller's view at `since` holds a node of that pod:
-- when no node changed since, the pod is not read (a pod with nodes cannot be removed, and a
-- node's removal or move bumps seq). One call whatever the number of nodes that did not change.
redis.register_function{function_name = 'pv_sched_changes', flags = {'no-writes'},
  callback = function(keys, args)
    local base, since, epoch, pod = args[1], args[2], args[3], args[4]
    local idx = redis.call('HMGET', base .. 'node-index', 'epoch', 'seq', 'removed')
    local seq, removed, full = tonumber(idx[2] or '0'), tonumber(idx[3] or '0'), 0
    local unmoved = idx[1] and idx[1] == epoch and seq == tonumber(since)
    if pod ~= '' and not (unmoved and args[5] == '1') and
        redis.call('HEXISTS', keys[1], pod) == 0 then
      return err('NOT_FOUND', 'pod ' .. pod .. ' not found')
    end
    if not idx[1] then return {'', '0', 1, {}, {}} end
    if idx[1] ~= epoch or seq < tonumber(since) or removed > tonumber(since) then
      full, since = 1, '0'
    end
    -- Every change sets its node's score to the seq it bumped, in the same step: when seq has
    -- not moved past `since`, no node has a score above it and the range is not read.
    local changed = {}
    if full == 1 or seq > tonumber(since) then
      changed = redis.call('ZRANGEBYSCORE', base .. 'node-revs', '(' .. since, '+inf',
        'WITHSCORES')
    end
    local dead = redis.call('ZRANGEBYSCORE', base .. 'node-alive', '-inf', '(' .. now_ms())
    return {idx[1], idx[2] or '0', full, changed, dead}
  end}

-- pv_sched_nodes(ARGV: base id...) -> for each id its record as HGETALL gives it ({} when gone).
-- Schedulers now call pv_sched_nodes_since; kept for those of the previous version during an
-- upgrade (the library is replaced by whichever process loads it first).
redis.register_function{function_name = 'pv_sched_nodes', flags = {'no-writes'},
  callback = function(keys, args)
    local out = {}
    for i = 2, #args do out[#out + 1] = redis.call('HGETALL', args[1] .. 'node:' .. args[i]) end
    return out
  end}

-- pv_sched_nodes_since(ARGV: base, then per node: id rev usage_rev, as the caller holds it, or
-- id '' '' for none) -> per node, {} when gone; {'=', usage, usage_rev, rev, updated_ms} when
-- every write since the revisions given was a write of its usage (each such write bumps both
-- revisions by one and writes usage and updated_ms alone; every other write of a node record
-- bumps rev alone: registry.lua), so the rest of what the caller holds is current; else the whole
-- record as HGETALL gives it. A reservation's commit changes some 50 nodes of a 10,000-node pod,
-- and every other scheduler then reads them: their usage, not a record of some 20 fields.
redis.register_function{function_name = 'pv_sched_nodes_since', flags = {'no-writes'},
  callback = function(keys, args)
    local base, out = args[1], {}
    for i = 2, #args, 3 do
      local key = base .. 'node:' .. args[i]
      local rev, urev = tonumber(args[i + 1]), tonumber(args[i + 2])
      local v = rev and urev and
        redis.call('HMGET', key, 'name', 'rev', 'usage_rev', 'usage', 'updated_ms')
      local d = v and v[1] and tonumber(v[2] or '0') - rev
      if d and d >= 0 and d == tonumber(v[3] or '0') - urev then
        out[#out + 1] = {'=', v[4] or '{}', v[3] or '0', v[2] or '0', v[5] or '0'}
      else
        out[#out + 1] = redis.call('HGETALL', key)
      end
    end
    return out
  end}

-- pv_sched_index(KEYS[1]=nodes index, ARGV: base epoch) -> the epoch of the index. Builds the
-- index from the records when there is none (data written before it existed); once built, every
-- writer keeps it (node_changed, registry.lua's node_removed and pv_reg_set_alive).
redis.register_function('pv_sched_index', function(keys, args)
  local base = args[1]
  local index = base .. 'node-index'
  local cur = redis.call('HGET', index, 'epoch')
  if cur then return cur end
  redis.call('DEL', base .. 'node-revs', base .. 'node-alive')
  local now = now_ms()
  for _, id in ipairs(redis.call('HVALS', keys[1])) do
    node_changed(base, id)
    local name = redis.call('HGET', base .. 'node:' .. id, 'name') or ''
    local left, until_ms = redis.call('PTTL', base .. 'alive:' .. name), 0
    if left == -1 then until_ms = 1e15 elseif left > 0 then until_ms = now + left end
    redis.call('ZADD', base .. 'node-alive', until_ms, id)
  end
  redis.call('HSET', index, 'epoch', args[2], 'removed', redis.call('HINCRBY', index, 'seq', 1))
  return args[2]
end)

redis.register_function{function_name = 'pv_sched_version', flags = {'no-writes'},
  callback = function(keys, args) return 1 end}
