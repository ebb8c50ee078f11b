# Dimensions have no unary minus.
dim B = -3
