package pools

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters.

// qLockPool creates the pool if needed and locks its row.
const qLockPool = `
INSERT INTO pools AS p (name, created_at, updated_at) VALUES (@name, @now, @now)
ON CONFLICT (name) DO UPDATE SET updated_at = greatest(p.updated_at, EXCLUDED.updated_at)`

// qLatestChange is the time of the pool's latest membership change. It is
// a statement of its own, after qLockPool: read in the locking statement,
// it would see the memberships as they were before the lock was waited
// for, missing a change committed meanwhile.
const qLatestChange = `
SELECT max(greatest(joined_at, coalesce(left_at, joined_at))) FROM pool_members WHERE pool = @name`

const qMembers = `SELECT customer FROM pool_members WHERE pool = @pool AND left_at IS NULL ORDER BY customer`

const qLeave = `
UPDATE pool_members SET left_at = @at
WHERE pool = @pool AND left_at IS NULL AND customer = ANY(@customers::text[])`

// qJoin starts a stay for each customer at @at. A customer that joined and
// left at @at itself (a stay that never counted: the pool changed twice at
// one instant) has that stay opened again: it is a member from @at.
const qJoin = `
INSERT INTO pool_members (pool, customer, joined_at, actor)
SELECT @pool, c, @at, @actor FROM unnest(@customers::text[]) AS c
ON CONFLICT (pool, customer, joined_at) DO UPDATE SET left_at = NULL, actor = EXCLUDED.actor`

const qPool = `SELECT name, created_at, updated_at FROM pools WHERE name = @name`

const qHistory = `
SELECT customer, joined_at, left_at, actor FROM pool_members
WHERE pool = @pool ORDER BY joined_at, customer`

const qPools = `
SELECT p.name, p.created_at, p.updated_at,
       coalesce((SELECT array_agg(m.customer ORDER BY m.customer) FROM pool_members m
                 WHERE m.pool = p.name AND m.left_at IS NULL), '{}')
FROM pools p ORDER BY p.name`

// qPoolsOf is the pools customer is a member of at @at.
const qPoolsOf = `
SELECT DISTINCT pool FROM pool_members
WHERE customer = @customer AND joined_at <= @at AND (left_at IS NULL OR left_at > @at)
ORDER BY pool`
