# args: --explian
# exit: 2
# A misspelt option of dmc: the nearest one.
dim B = 4
