# KNOWN BUG: an optimizer written with dimensions in [ ] is accepted and the
# brackets are silently ignored.
# Expected: an error like the one for builtins ("sgd is a function; call it with ( )").
optimizer sgd[3](lr = 0.1)
