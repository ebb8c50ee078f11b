input y : i32[]
minimize y
