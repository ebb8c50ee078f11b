minimize loss
