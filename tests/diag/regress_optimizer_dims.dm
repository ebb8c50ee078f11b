# Regression test: an optimizer written with dimensions in [ ] was accepted, the
# brackets silently ignored.
optimizer sgd[3](lr = 0.1)
