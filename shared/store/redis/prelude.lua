--[[
  The helpers every pivirt Redis function library shares. Redis keeps each library apart (one
  cannot call another's local functions), so the build puts this text into each of them, right
  after its "#!lua name=..." line (shared/cmake/embed.cmake): these locals are in scope in
  every library's functions, and a library does not define them again.
]]

-- Redis's clock in milliseconds, so every writer agrees.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The error reply '<CODE> <message>' that pv_redis maps back to a status code.
local function err(code, msg)
  return redis.error_reply(code .. ' ' .. msg)
end

-- The id a name index (a hash name -> id) holds for name, or nil and the NOT_FOUND reply
-- '<kind> <name> not found'.
local function find_id(index, kind, name)
  local id = redis.call('HGET', index, name)
  if not id then return nil, err('NOT_FOUND', kind .. ' ' .. name .. ' not found') end
  return id
end

-- A function whose ARGV[2] names a <kind> of the name index KEYS[at]: fn(keys, args, id) with
-- that one's id, or the NOT_FOUND reply when there is none.
local function with_id(at, kind, fn)
  return function(keys, args)
    local id, missing = find_id(keys[at], kind, args[2])
    if not id then return missing end
    return fn(keys, args, id)
  end
end

-- The FAILED_PRECONDITION reply '<subject> still <verb> <n> <what>' when n > 0, else nil.
local function still(subject, verb, n, what)
  if n > 0 then
    return err('FAILED_PRECONDITION', subject .. ' still ' .. verb .. ' ' .. n .. ' ' .. what)
  end
end

-- Records that node <id> changed in a way a scheduler must see (usage, allocations, resources,
-- labels, bypass, its addition): the registry-wide change counter goes up and the node's entry
-- in the change index takes the new value (node-index, node-revs: shared/store/pv_sched.h).
-- Every function that bumps a node's rev calls this in the same step, so a scheduler that read
-- the index up to sequence S finds every later change by asking for scores above S.
local function node_changed(base, id)
  local seq = redis.call('HINCRBY', base .. 'node-index', 'seq', 1)
  redis.call('ZADD', base .. 'node-revs', seq, id)
  return seq
end

-- A node record's usage revision and record revision, read for a compare-and-set of its usage
-- (nil when the record is gone: every node record has its name). One read for what an EXISTS
-- and an HGET of usage_rev did.
local function node_revs(node_key)
  local v = redis.call('HMGET', node_key, 'name', 'usage_rev', 'rev')
  if not v[1] then return nil end
  return {usage_rev = v[2] or '0', rev = v[3] or '0'}
end

-- Writes a node's new usage with both revisions bumped from revs (node_revs, read in this very
-- call, so nothing moved them since): one HSET for what an HSET and two HINCRBY did. The change
-- goes into the schedulers' change index in the same step (node_changed).
-- node_write_usage writes the record alone, for a caller that puts the change into the index
-- itself (several nodes at once: nodes_changed).
local function node_write_usage(node_key, revs, usage, now)
  local urev, rev = tonumber(revs.usage_rev) + 1, tonumber(revs.rev) + 1
  revs.usage_rev, revs.rev = tostring(urev), tostring(rev)
  redis.call('HSET', node_key, 'usage', usage, 'updated_ms', now, 'usage_rev', revs.usage_rev,
    'rev', revs.rev)
end

local function node_set_usage(node_key, revs, usage, now)
  node_write_usage(node_key, revs, usage, now)
  return node_changed(node_key:match('^(.*)node:([^:]*)$'))
end

-- Arguments per call where a list is spread into one command: Lua's unpack is bounded by its C
-- stack (some 8,000 values), and a plan may touch every node of a 10,000-node pod.
local SPREAD = 1000

-- What node_changed does for the nodes ids (a list), in two commands instead of two a node: the
-- counter goes up by their number and each takes its own value, in list order. Returns the
-- value of the first (the others follow it).
local function nodes_changed(base, ids)
  local n = #ids
  local first = redis.call('HINCRBY', base .. 'node-index', 'seq', n) - n + 1
  for from = 1, n, SPREAD do
    local scored = {}
    for k = from, math.min(n, from + SPREAD - 1) do
      scored[#scored + 1] = first + k - 1
      scored[#scored + 1] = ids[k]
    end
    redis.call('ZADD', base .. 'node-revs', unpack(scored))
  end
  return first
end
