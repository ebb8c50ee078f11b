# A second mesh statement is an error even after a mesh of no axes, as a second of any
# other setting is.
mesh()
mesh(data = 2)
