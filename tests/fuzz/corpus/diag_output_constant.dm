dim B = 4
output B
