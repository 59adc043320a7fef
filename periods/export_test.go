package periods

// ResolveWall exposes resolveWall to the external tests.
var ResolveWall = resolveWall
